"""The whole build's helpers, as the Makefile runs them: `python -m kimipipe.fullbuild CMD`.

    check     what would fail later, before any money is spent (`make check`, `make all`)
    plan      the build's money arithmetic over every dataset (`make plan`; `--gate`:
              `make all` refuses to start when TOTAL_COST cannot pay for it)
    pilot     what a pilot's answers measured, to a small file `make plan` reads
    stopped   the message of a money stop under make: the make variable to change

Modules: measure.py (figures from a responses file), plan.py (the arithmetic),
report.py (the plan as printed), check.py, stop.py, __main__.py (the arguments make
passes).
"""
