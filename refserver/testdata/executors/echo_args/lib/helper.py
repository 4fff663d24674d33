def wrap(args):
    return {"ok": True, "entries": [{"echo": args}], "ok_count": 1}
