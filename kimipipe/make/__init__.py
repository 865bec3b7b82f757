"""What make runs between the stages: `python -m kimipipe.make CMD` (the Makefile's KP_MAKE).

    check     what would fail later, before any money is spent (`make check`, `make all`)
    plan      the build's money arithmetic over every dataset (`make plan`; `--gate`:
              `make all` refuses to start when TOTAL_COST cannot pay for it)
    pilot     what a pilot's answers measured, to a small file `make plan` reads
    stopped   the message of a money stop under make: the make variable to change

Modules: check.py (`make check`), measure.py (figures from a responses file),
build_plan.py (the build's money arithmetic; kp-infer's own `--plan` is infer/plan.py),
plan_report.py (that plan as printed), stop.py, clean.py, __main__.py (the arguments make
passes).
"""
