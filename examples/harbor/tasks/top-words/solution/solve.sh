#!/bin/bash
set -e
cat > /app/top_words.sh <<'SCRIPT'
#!/bin/bash
# Split on every non-letter, lowercase, count, then order by count (desc) and
# word (asc). LC_ALL=C keeps the word order plain byte order.
export LC_ALL=C
tr -cs 'A-Za-z' '\n' < "$1" | tr 'A-Z' 'a-z' | grep -v '^$' \
    | sort | uniq -c | sort -k1,1nr -k2,2 | head -n "$2" | awk '{ print $1, $2 }'
SCRIPT
chmod +x /app/top_words.sh
