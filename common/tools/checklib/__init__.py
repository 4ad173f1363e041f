"""The engine of `kit check` (common/tools/check.py): running a trainer and reading its traces
(runs), the verdicts, explaining a failed build (build_errors), judgments shared by the DDP
exercises (judges) and the flow of one check (engine). What is particular to an exercise lives in
common/tools/rules/<target>.py."""
