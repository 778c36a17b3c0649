#!/bin/sh
# Install KV Primer's menu entry, icons and AppStream metainfo for the current user.
#
#   packaging/install-desktop.sh [EXECUTABLE]
#
# EXECUTABLE is what the menu entry starts: the bundle's dist/kvprimer/kvprimer (default), or
# the kvprimer-gui script of a pip-installed wheel, e.g. "$(command -v kvprimer-gui)".
# Files go under ${XDG_DATA_HOME:-~/.local/share}; remove them with --uninstall.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
data=${XDG_DATA_HOME:-$HOME/.local/share}
sizes="16 24 32 48 64 128 256 512"

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$data/applications/kvprimer.desktop" "$data/metainfo/org.kvprimer.KVPrimer.metainfo.xml" \
          "$data/icons/hicolor/scalable/apps/kvprimer.svg"
    for n in $sizes; do rm -f "$data/icons/hicolor/${n}x${n}/apps/kvprimer.png"; done
    echo "removed KV Primer's menu entry from $data"
    exit 0
fi

exe=${1:-$root/dist/kvprimer/kvprimer}
case "$exe" in /*) ;; *) exe="$(pwd)/$exe" ;; esac
if [ ! -x "$exe" ]; then
    echo "install-desktop.sh: $exe is not an executable; build the bundle with 'make package'" >&2
    echo "or pass the path of kvprimer-gui" >&2
    exit 2
fi

mkdir -p "$data/applications" "$data/metainfo" "$data/icons/hicolor/scalable/apps"
# Exec= takes a quoted path when it has spaces (Desktop Entry spec, "The Exec key").
case "$exe" in *" "*) exec_line="\"$exe\"" ;; *) exec_line="$exe" ;; esac
esc=$(printf '%s' "$exec_line" | sed 's/[\\|&]/\\&/g')  # for sed's replacement
sed "s|^Exec=.*|Exec=$esc|" "$here/kvprimer.desktop" > "$data/applications/kvprimer.desktop"
cp "$here/org.kvprimer.KVPrimer.metainfo.xml" "$data/metainfo/"
cp "$root/resources/icon.svg" "$data/icons/hicolor/scalable/apps/kvprimer.svg"
for n in $sizes; do
    mkdir -p "$data/icons/hicolor/${n}x${n}/apps"
    cp "$here/icons/hicolor/${n}x${n}/apps/kvprimer.png" "$data/icons/hicolor/${n}x${n}/apps/"
done
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$data/applications" || true
command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "$data/icons/hicolor" || true
echo "installed KV Primer's menu entry in $data/applications (Exec=$exe)"
