ROOT = "local"
