#!/usr/bin/python3
"""Runs every test_* function of the test_*.py files here and ends with the line
`N passed, N failed, N skipped` that ci/test.sh adds to its totals.

    /usr/bin/python3 tests/python/run.py [FILTER]"""
import glob
import importlib.util
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))


class Skip(Exception):
    pass


def main():
    pattern = sys.argv[1] if len(sys.argv) > 1 else ""
    passed = failed = skipped = 0
    for path in sorted(glob.glob(os.path.join(HERE, "test_*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        module.Skip = Skip
        try:
            spec.loader.exec_module(module)
        except Exception:
            print("FAIL %s (import):\n%s" % (name, traceback.format_exc()))
            failed += 1
            continue
        for attr in sorted(dir(module)):
            if not attr.startswith("test_") or pattern not in "%s.%s" % (name, attr):
                continue
            start = time.time()
            try:
                getattr(module, attr)()
            except Skip as why:
                skipped += 1
                print("skip %s.%s: %s" % (name, attr, why))
                continue
            except Exception:
                failed += 1
                print("FAIL %s.%s:\n%s" % (name, attr, traceback.format_exc()))
                continue
            passed += 1
            print("ok   %s.%s (%.0f ms)" % (name, attr, (time.time() - start) * 1e3))
        close = getattr(module, "teardown", None)
        if close:
            close()
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
