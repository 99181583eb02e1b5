#!/bin/bash
set -e
cat > /app/count_errors.sh <<'SCRIPT'
#!/bin/bash
# grep -c prints 0 (and exits 1) when nothing matches; the count is what matters.
grep -c 'ERROR' "$1"
SCRIPT
chmod +x /app/count_errors.sh
