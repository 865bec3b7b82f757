"""kp-infer: placeholder until issue 4 lands; exits 2 with "not yet built", writes nothing."""

from ..cli import not_yet_built, run_command

cli = not_yet_built("kp-infer", "issue 4")
main = run_command(cli)
