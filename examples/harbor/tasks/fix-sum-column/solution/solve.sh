#!/bin/bash
set -e
# Three bugs: the column was hard-coded, the header was summed, and an empty
# sum printed an empty line.
cat > /app/sum_column.sh <<'SCRIPT'
#!/bin/bash
# Usage: sum_column.sh FILE N
# Prints the sum of the N-th (1-based) column of a comma-separated FILE,
# skipping the header line.
file=$1
column=$2
awk -F, -v column="$column" 'NR > 1 { total += $column } END { print total + 0 }' "$file"
SCRIPT
chmod +x /app/sum_column.sh
