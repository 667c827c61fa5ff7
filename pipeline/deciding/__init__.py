"""Seeds until decided: each ablation against the baseline decided at seed counts fixed in advance
(rule.py; its proof: docs/seeds-until-decided.md), round by round (rounds.py), in a typed record
(record.py). Pure: no files but the record's, no processes; the rounds loop that drives it is
pipeline/grid/decide.py."""
