# Sourced by the scripts that draw charts (PNG) from recorded CSV/JSON.
# plot_python prints the path of a Python with matplotlib, pinned by
# scripts/lib/plot-requirements.txt, installed from PyPI into
# $HEADROOM_CACHE_DIR/plot-venv on first use (about 30 s) and reused after.
plot_python() {
  local here venv req stamp
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  req="$here/plot-requirements.txt"
  venv="${HEADROOM_CACHE_DIR:?HEADROOM_CACHE_DIR unset}/plot-venv"
  stamp="$venv/.requirements"
  if ! cmp -s "$req" "$stamp" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
    cp "$req" "$stamp"
  fi
  printf '%s\n' "$venv/bin/python"
}
