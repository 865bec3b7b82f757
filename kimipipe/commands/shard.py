"""kp-shard: placeholder until issue 7 lands; exits 2 with "not yet built", writes nothing."""

from ..cli import not_yet_built, run_command

cli = not_yet_built("kp-shard", "issue 7")
main = run_command(cli)
