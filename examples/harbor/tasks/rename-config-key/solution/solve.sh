#!/bin/bash
set -e
find /app/config -name '*.ini' -type f \
    -exec sed -i -E 's/^db_host([[:space:]]*=)/database_host\1/' {} +
