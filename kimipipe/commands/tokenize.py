"""kp-tokenize: placeholder until issue 6 lands; exits 2 with "not yet built", writes nothing."""

from ..cli import not_yet_built, run_command

cli = not_yet_built("kp-tokenize", "issue 6")
main = run_command(cli)
