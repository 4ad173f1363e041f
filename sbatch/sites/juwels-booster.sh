# shellcheck shell=bash
# Site profile "juwels-booster": JUWELS Booster at JSC, partition booster (4 A100 per node).
# Details: jsc.sh.
KIT_JSC_SYSTEM=juwelsbooster
# shellcheck source-path=SCRIPTDIR source=jsc.sh
. "$(dirname "${BASH_SOURCE[0]}")/jsc.sh"
export KIT_SITE=juwels-booster
