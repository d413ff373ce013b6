# Two training runs gave the same bits (sourced by tests/guard.sh and scripts/compare-builds).
# numbers DUMP: each step's loss, aux, grad_norm and lr as logged (17 digits)
numbers() { grep -o '"\(step\|loss\|aux_loss\|grad_norm\|lr\)":[^,}]*' "$1/metrics.jsonl"; }
# same_run A B: the same numbers and the same bytes in every weight and optimizer file saved
same_run() {
  local a=$1 b=$2 f n=0
  [ -n "$(numbers "$a")" ] && [ "$(numbers "$a")" = "$(numbers "$b")" ] ||
    { echo "numbers differ: $(diff <(numbers "$a") <(numbers "$b") | head -4)"; return 1; }
  for f in "$a"/checkpoint/step-*/*.safetensors; do
    [ -e "$f" ] || continue
    cmp -s "$f" "$b/${f#"$a"/}" || { echo "${f#"$a"/} differs"; return 1; }
    n=$((n + 1))
  done
  [ $n -gt 0 ] || { echo "no checkpoint files in $a"; return 1; }
}
