import json, sys


def run_stdio(fn):
    print(json.dumps(fn(json.load(sys.stdin))))
