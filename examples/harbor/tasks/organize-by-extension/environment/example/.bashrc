set -o vi
