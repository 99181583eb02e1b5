#!/bin/bash
set -uxo pipefail
cd /testbed
if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi
git checkout 13ca9485406e645c614479bac8014631fd5bd7b0 -- tests/test_slug.py || { echo '>>>>> Reset Failed'; exit 1; }
git apply -v - <<'EOF_114329324912' || { echo '>>>>> Patch Apply Failed'; exit 1; }
diff --git a/tests/test_slug.py b/tests/test_slug.py
index bdcad39..b65af98 100644
--- a/tests/test_slug.py
+++ b/tests/test_slug.py
@@ -7,3 +7,11 @@ def test_single_word():
 
 def test_lowercases_words():
     assert slugify("Release Notes") == "release-notes"
+
+
+def test_collapses_separators():
+    assert slugify("a,  b -- c") == "a-b-c"
+
+
+def test_strips_edge_dashes():
+    assert slugify("  Hello, World!") == "hello-world"
EOF_114329324912
: '>>>>> Start Test Output'
pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_slug.py
SWEBENCH_TEST_EXIT_CODE=$?
: '>>>>> End Test Output'
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
git checkout 13ca9485406e645c614479bac8014631fd5bd7b0 -- tests/test_slug.py
