"""Seeds until decided: a study that adds seeds only to the ablations whose verdict is still open,
and stops each comparison at a look fixed before the study, with the family-wise error of every
reported interval and verdict kept at alpha however the looks turn out (issue #49).

rule    the sequential stopping rule: the plan, one look's paired t-interval and verdict, and the
        whole rule over complete simulated studies (numpy and scipy only, with the proof)
rounds  the round logic over plain dicts: the seed order, which looks each comparison took, and
        which seeds each variant and the baseline run next; the runs spent beside a fixed design
"""
