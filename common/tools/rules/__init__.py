"""Each exercise's rules for `kit check`: common/tools/rules/<target>.py, where <target> is the
exercise's info.toml target ("ex01"). A rules module defines

  RUN_FLAGS      the flags of every check run; NODES_FLAGS those of the one-rank-per-node run
                 (None: no such run)
  LABELS         concept -> TODO label, for the judges of checklib/judges.py
  RUN_ENV        optional: environment of every run, over the engine's defaults (e.g. a
                 shorter KIT_TIMEOUT for a program that takes a second)
  prepare_data(check, directory) -> the data folder the runs read (None: no data); programs
                 of the build come from check.tool(name) (info.toml's [check] tools)
  data_key()     what the data depends on (part of the reference run's cache key)
  judge(check)   adds one verdict per TODO to check.verdicts, from check.many, check.nodes,
                 check.alone and check.reference (checklib/engine.py)

and may define

  FLAG_RUNS      name -> flags: more runs of the student's build and the solution's with values
                 of the flags its TODOs must honour other than RUN_FLAGS' (check.flag_runs[name]
                 = (mine, the solution's)), so that a hard-coded default does not pass

and, for the closing comparison with the solution's run (checklib/compare.py,
judge_run()):

  PLACES         name -> (a piece of a solution line, what it is): the trainer lines that a
                 difference outside the TODOs points at ("init", "forward", "update",
                 "checkpoint", "final")
  RESULT_LINES   patterns of the printed result lines, compared from a rank's output when that
                 rank printed them without print0
"""
