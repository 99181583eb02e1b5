#!/bin/bash
# Usage: sum_column.sh FILE N
# Prints the sum of the N-th (1-based) column of a comma-separated FILE,
# skipping the header line.
file=$1
column=$2
awk -F, '{ total += $2 } END { print total }' "$file"
