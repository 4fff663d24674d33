print("{\"ok\": true, \"results\": []}")
