"""A launchable engine double whose fault is on only in the first engine launched: a stand-in
for a timing-dependent fault that a freshly started engine does not reproduce (the reproducer
confirmation of issue 23, pleharness/reproduce.py).

Used through ``tests/fakepy_repro/python`` as ``--engine-python``. It wraps
``tests/fault_engine.py`` (same environment: ``PLE_FAULT_UPSTREAM``, ``PLE_FAULT_MODE``, ...,
``PLE_REAL_PYTHON``) and adds ``PLE_REPRO_MARKER``, a file path: the launch that finds no file
there creates it and runs with the fault on (``PLE_FAULT_WHEN=always``); every later launch
finds it and runs with the fault off. Any other use of this "python" (``-c`` probes) runs the
real interpreter.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    real = os.environ["PLE_REAL_PYTHON"]
    if len(argv) < 3 or argv[1] != "-m" or not argv[2].startswith("vllm.entrypoints"):
        os.execv(real, [real] + argv[1:])
    marker = os.environ["PLE_REPRO_MARKER"]
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # atomic: the first one wins
        os.write(fd, f"fault on in launch pid {os.getpid()}\n".encode())
        os.close(fd)
        first = True
    except FileExistsError:
        first = False
    # a flag no launch carries switches tests/fault_engine.py's fault off
    os.environ["PLE_FAULT_WHEN"] = "always" if first else "--no-such-flag-fault-off"
    os.execv(real, [real, os.path.join(HERE, "fault_engine.py")] + argv[1:])


if __name__ == "__main__":
    main(sys.argv)
