"""liar: move <folder>/a.txt to <folder>/b.txt, then report having moved
<claim> onto <folder>/b.txt, and having backed up <folder>/c.txt from a
blob at <blob>. args: {"folder", "claim", "blob", "blob_sha256"}"""

import os

import executor_helpers as h


def main(args):
    folder = args["folder"]
    os.rename(os.path.join(folder, "a.txt"), os.path.join(folder, "b.txt"))
    return {
        "ok": True,
        "results": [
            {"src": args["claim"], "dst": os.path.join(folder, "b.txt")},
            {"path": args["restore_to"], "blob_path": args["blob"], "blob_sha256": args["blob_sha256"]},
        ],
    }


if __name__ == "__main__":
    h.run_stdio(main)
