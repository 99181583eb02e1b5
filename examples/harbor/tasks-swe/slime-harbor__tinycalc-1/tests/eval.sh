#!/bin/bash
set -uxo pipefail
cd /testbed
if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi
git checkout 5fb1d4d5d75eb8ca6a1e16a990e271d87b9ded4b -- tests/test_parse.py || { echo '>>>>> Reset Failed'; exit 1; }
git apply -v - <<'EOF_114329324912' || { echo '>>>>> Patch Apply Failed'; exit 1; }
diff --git a/tests/test_parse.py b/tests/test_parse.py
index 1ccaeb9..c3b7719 100644
--- a/tests/test_parse.py
+++ b/tests/test_parse.py
@@ -15,3 +15,13 @@ def test_float():
 def test_rejects_words():
     with pytest.raises(ValueError):
         parse_number("forty")
+
+
+def test_negative_integer():
+    assert parse_number("-3") == -3
+    assert type(parse_number("-3")) is int
+
+
+def test_surrounding_whitespace():
+    assert parse_number(" 7 ") == 7
+    assert parse_number("\t2.5\n") == 2.5
EOF_114329324912
: '>>>>> Start Test Output'
pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_parse.py
SWEBENCH_TEST_EXIT_CODE=$?
: '>>>>> End Test Output'
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
git checkout 5fb1d4d5d75eb8ca6a1e16a990e271d87b9ded4b -- tests/test_parse.py
