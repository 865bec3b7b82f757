"""What the stages' files record, read by every tool that needs it (the rooms above:
kp-infer's run, `kp-infer report`, make's plan, pilot and clean, the build report, the
stand-in), so that none of them reaches into another's package:

    api.py             which API answered a record (`api`), the stand-in's mark on its
                       generation ids, a resume against another API refused
    spend.py           the spend recorded in responses and failures files (finished lines
                       only), what --spent-in names: every cap's and plan's count
    providers_table.py the providers compared, one row per provider, made the same way from
                       a run's answers (its summary) and from files (kp-infer report, the
                       build report)
    identity_table.py  identity per provider (kp-infer --tokenizer), the same way, and the
                       identity file a run leaves beside its output (its quarantines)
    asked.py           what a prompt asks, as a digest: an answer to a prompt as it is now
                       told from one to the same ID before its source was fixed
    lines.py           any line of a build's record files (response, token, failure,
                       reject) through one view, sorted by its fields: what `kp-infer
                       report` and the build report read
"""
