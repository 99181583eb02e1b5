#!/bin/bash
set -e
cat > /app/dedupe.sh <<'SCRIPT'
#!/bin/bash
# Print a line only the first time it is seen.
awk '!seen[$0]++' "$1"
SCRIPT
chmod +x /app/dedupe.sh
