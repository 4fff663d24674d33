import json, sys
from lib.helper import wrap

args = json.load(sys.stdin)
print(json.dumps(wrap(args)))
