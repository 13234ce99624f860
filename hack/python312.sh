# Sourced by the setup parts that need a Python 3.12 interpreter (harbor's venv, SkyRL's): find_python312 prints
# the first one found on PATH, in the usual places or under pyenv.
find_python312() {
  local cand
  for cand in "$(command -v python3.12 2>/dev/null || true)" /usr/bin/python3.12 /usr/local/bin/python3.12 \
              "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3.12; do
    [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
      && { echo "$cand"; return 0; }
  done
  return 1
}
