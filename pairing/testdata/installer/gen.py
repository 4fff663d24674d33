# Regenerate with: cd pairing/testdata/installer && python3 gen.py
# (functions copied from the real server runtime/agent_server.py).
# Builds the installers exactly as agent_server.py client_join_installer does.
import sys
def _sh_squote(s): return "'" + s.replace("'", "'\\''") + "'"
_CMD_MARKER = "#::METNOS-PS1::#"
def _cmd_env_line(name, value): return f'set "{name}={value}"'
def _windows_cmd_installer(env, ps_body):
    m_head, m_tail = _CMD_MARKER[:9], _CMD_MARKER[9:]
    boot = ('powershell -NoProfile -ExecutionPolicy Bypass -Command '
        f'"$m=\'{m_head}\'+\'{m_tail}\'; '
        '$t=[IO.File]::ReadAllText($env:METNOS_SELF); '
        '$i=$t.IndexOf($m); if ($i -lt 0) { exit 9 }; '
        'Invoke-Expression $t.Substring($i+$m.Length)"')
    head = ["@echo off","setlocal","title Metnos Client Setup",
        "rem Installer Metnos: doppio click per eseguire. La finestra resta",
        "rem aperta a fine corsa con l'esito (mai un errore che sparisce).",
        *(_cmd_env_line(k, v) for k, v in env.items()),
        'set "METNOS_SELF=%~f0"', boot, 'set "EC=%ERRORLEVEL%"', "echo.",
        'if "%EC%"=="0" (echo [OK] Installazione completata. Puoi chiudere '
        "questa finestra.) else (echo [ERRORE] Installazione NON riuscita: "
        "leggi il messaggio qui sopra.)", "pause", "exit /b %EC%", _CMD_MARKER]
    return ("\r\n".join(head) + "\r\n" + ps_body).encode("utf-8")
def sh(server_url, token, body):
    prelude = (f"METNOS_SERVER={_sh_squote(server_url)}; export METNOS_SERVER\n"
               f"METNOS_TOKEN={_sh_squote(token)}; export METNOS_TOKEN\n")
    lines = body.split("\n", 1)
    return ((lines[0] + "\n" + prelude + (lines[1] if len(lines) > 1 else "")) if lines[0].startswith("#!") else prelude + body).encode()
SH_BODY = '''#!/bin/sh
# Metnos client installer (test body shaped as install.sh.in)
set -eu
: "${METNOS_SERVER:?set METNOS_SERVER}"
: "${METNOS_TOKEN:?set METNOS_TOKEN}"
METNOS_SERVER="${METNOS_SERVER%/}"
curl -fsSL "$METNOS_SERVER/agent/client/manifest.json" -o /tmp/m.json
echo "METNOS_TOKEN=$METNOS_TOKEN" >/dev/null
'''
PS_BODY = '''$ErrorActionPreference = 'Stop'
if (-not $env:METNOS_SERVER) { throw 'set METNOS_SERVER' }
$env:METNOS_SERVER = $env:METNOS_SERVER.TrimEnd('/')
iwr "$env:METNOS_SERVER/agent/client/manifest.json" -UseBasicParsing
'''
TOK = "DEV.eyJ0aWQiOiJhYmMxMjMiLCJuIjoibGFwdG9wIn0.c2lnbmF0dXJlX2J5dGVz-_"
open("linux.sh","wb").write(sh("http://metnos.tail1234.ts.net:8765", TOK, SH_BODY))
open("linux-noshebang.sh","wb").write(sh("http://127.0.0.1:8765", TOK, SH_BODY.split("\n",1)[1]))
# A Host header with a quote, as an attacker's Host could carry: quoted by _sh_squote.
open("linux-quote.sh","wb").write(sh("http://evil'host:8765", TOK, SH_BODY))
open("windows.cmd","wb").write(_windows_cmd_installer({"METNOS_SERVER":"http://192.168.1.10:8765","METNOS_TOKEN":TOK,
  "METNOS_CLIENT_VERSION":"0.9.3","METNOS_CLIENT_SHA256":"ab"*32,
  "METNOS_PYTHON_RUNTIME_WIN":"cpython-3.12.13+20260623-x86_64-pc-windows-msvc-install_only.tar.gz"}, PS_BODY))
