#!/bin/bash
set -e
# hi is inclusive, so a one-element range (lo == hi) still has to be checked.
sed -i 's/while lo < hi:/while lo <= hi:/' /app/search.py
