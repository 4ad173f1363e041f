# shellcheck shell=bash
# Site profile "jureca": JURECA-DC at JSC, partition dc-gpu (4 A100 per node). Details: jsc.sh.
KIT_JSC_SYSTEM=jurecadc
# shellcheck source-path=SCRIPTDIR source=jsc.sh
. "$(dirname "${BASH_SOURCE[0]}")/jsc.sh"
export KIT_SITE=jureca
