@echo off
setlocal
title Metnos Client Setup
rem Installer Metnos: doppio click per eseguire. La finestra resta
rem aperta a fine corsa con l'esito (mai un errore che sparisce).
set "METNOS_SERVER=http://192.168.1.10:8765"
set "METNOS_TOKEN=DEV.eyJ0aWQiOiJhYmMxMjMiLCJuIjoibGFwdG9wIn0.c2lnbmF0dXJlX2J5dGVz-_"
set "METNOS_CLIENT_VERSION=0.9.3"
set "METNOS_CLIENT_SHA256=abababababababababababababababababababababababababababababababab"
set "METNOS_PYTHON_RUNTIME_WIN=cpython-3.12.13+20260623-x86_64-pc-windows-msvc-install_only.tar.gz"
set "METNOS_SELF=%~f0"
powershell -NoProfile -ExecutionPolicy Bypass -Command "$m='#::METNOS'+'-PS1::#'; $t=[IO.File]::ReadAllText($env:METNOS_SELF); $i=$t.IndexOf($m); if ($i -lt 0) { exit 9 }; Invoke-Expression $t.Substring($i+$m.Length)"
set "EC=%ERRORLEVEL%"
echo.
if "%EC%"=="0" (echo [OK] Installazione completata. Puoi chiudere questa finestra.) else (echo [ERRORE] Installazione NON riuscita: leggi il messaggio qui sopra.)
pause
exit /b %EC%
#::METNOS-PS1::#
$ErrorActionPreference = 'Stop'
if (-not $env:METNOS_SERVER) { throw 'set METNOS_SERVER' }
$env:METNOS_SERVER = $env:METNOS_SERVER.TrimEnd('/')
iwr "$env:METNOS_SERVER/agent/client/manifest.json" -UseBasicParsing
