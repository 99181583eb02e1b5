#!/bin/bash
set -e
cat > /app/organize.sh <<'SCRIPT'
#!/bin/bash
# Usage: organize.sh DIR -- sort the files directly in DIR into DIR/<extension>/.
dir=$1
shopt -s dotglob nullglob
for path in "$dir"/*; do
    [ -f "$path" ] && [ ! -L "$path" ] || continue
    name=${path##*/}
    stem=${name#.}  # a leading dot marks a hidden file, not an extension
    if [[ $stem == *.* ]]; then
        extension=${stem##*.}
        extension=${extension,,}
    else
        extension=other
    fi
    mkdir -p "$dir/$extension"
    mv -- "$path" "$dir/$extension/"
done
SCRIPT
chmod +x /app/organize.sh
