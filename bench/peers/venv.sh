# venv.sh: the virtual environment the peer benches share (sourced by
# adam_peers.sh and train_peers.sh, not run).
#
# peers_venv VENV BASE_PYTHON CHECK PACKAGE... makes VENV (unless it has a
# python already) and installs the packages with pip when the python
# statement CHECK fails in it. When BASE_PYTHON is given (PEERS_BASE_PYTHON)
# the venv sees its packages: --system-site-packages covers a system python,
# and a .pth file covers a BASE_PYTHON that is itself a venv, whose packages
# --system-site-packages does not reach.
peers_venv() {
	local venv=$1 base=$2 check=$3
	shift 3
	if [[ ! -x "$venv/bin/python" ]]; then
		local site=()
		[[ -n "${PEERS_BASE_PYTHON:-}" ]] && site=(--system-site-packages)
		"$base" -m venv "${site[@]}" "$venv"
		if [[ -n "${PEERS_BASE_PYTHON:-}" ]]; then
			local base_site own_site
			base_site=$("$base" -c 'import sys, site; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')
			own_site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
			[[ -n "$base_site" ]] && echo "$base_site" >"$own_site/peers-base.pth"
		fi
	fi
	if ! "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
		"$venv/bin/pip" install --quiet "$@"
	fi
}
