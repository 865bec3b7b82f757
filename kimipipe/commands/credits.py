"""kp-credits: placeholder until issue 3 lands; exits 2 with "not yet built", writes nothing."""

from ..cli import not_yet_built, run_command

cli = not_yet_built("kp-credits", "issue 3")
main = run_command(cli)
