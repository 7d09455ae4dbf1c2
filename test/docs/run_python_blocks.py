"""Runs on every rank (under tntrun): the python blocks of the docs, then the
examples in the docstrings of the public API, each recorded as passed or with
its traceback in OUT/rank<r>.json.

    tntrun -n 2 -- run_python_blocks.py SPEC.json OUT

SPEC.json: [{"page": ..., "dir": folder to run in, "fragments": bool,
"blocks": [{"id": ..., "text": ...}]}]. TensorFlow is imported once for all.
"""
import json
import os
import re
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import doc_blocks  # noqa: E402
import doc_fragments as fragments  # noqa: E402


def run(block_id, text, namespace, results):
    # a real file, for the tracebacks and for the tools that read a function's
    # source (tf.function's autograph)
    path = os.path.abspath(re.sub(r"[^\w.-]+", "_", block_id) + ".py")
    with open(path, "w") as f:
        f.write(text)
    try:
        exec(compile(text, path, "exec"), namespace)
        results[block_id] = None
    except BaseException:  # noqa: B902 - SystemExit too: a block must not end the run
        results[block_id] = traceback.format_exc()


def public_objects():
    import tarantella as tnt

    objects = {f"tnt.{n}": getattr(tnt, n) for n in tnt.__all__}
    for module in (tnt.data, tnt.models, tnt.keras.callbacks, tnt.optimizers):
        objects.update({f"{module.__name__}.{n}": getattr(module, n) for n in module.__all__})
    return {n: o for n, o in objects.items()
            if getattr(o, "__module__", "").startswith("tarantella")}


def unresolved_names():
    """None if every `tnt.X.Y` of the pages is an attribute (and none of those they cite
    on purpose as absent is), else what is wrong: a renamed function or a class left in the
    prose reads as Tarantella's API until a user's AttributeError."""
    import tarantella as tnt

    def resolves(name):
        obj = tnt
        try:
            for part in name.split(".")[1:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True

    problems = [f"{name} (at {', '.join(where)}) is no attribute"
                for name, where in sorted(doc_blocks.cited_names().items())
                if name not in doc_blocks.NOT_ATTRIBUTES and not resolves(name)]
    problems += [f"{name} exists now: remove it from doc_blocks.NOT_ATTRIBUTES"
                 for name in sorted(doc_blocks.NOT_ATTRIBUTES) if resolves(name)]
    return "\n".join(problems) or None


def main():
    spec_path, out = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    results = {}
    for page in spec:
        os.chdir(page["dir"])
        namespace = {"__name__": "__main__"}
        if page["fragments"]:
            run(f"{page['page']}:setup", fragments.SETUP, namespace, results)
        for block in page["blocks"]:
            run(block["id"], block["text"], namespace, results)
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        for name, code in doc_blocks.docstring_blocks(public_objects()):
            namespace = {"__name__": "__main__"}
            run(f"docstring of {name}:setup", fragments.SETUP, namespace, results)
            run(f"docstring of {name}", code, namespace, results)

    results["the tnt.NAMEs the pages cite"] = unresolved_names()

    import tarantella as tnt

    with open(os.path.join(out, f"rank{tnt.get_rank()}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
