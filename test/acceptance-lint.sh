#!/usr/bin/env bash
# Lints the acceptance scripts test/macos/accept.sh and
# test/windows/accept.ps1. Installs nothing: a linter that is missing is
# skipped with a line saying how to install it.
#
#   for accept.sh:  apt-get install -y shellcheck
#   for accept.ps1: npm install -g tree-sitter@0.25.1 tree-sitter-powershell@0.26.4
#
# No PowerShell runs here (Debian does not package it; the npm "pwsh"
# package downloads it at install time), so accept.ps1 gets a syntax check
# by the tree-sitter PowerShell grammar, not PSScriptAnalyzer: every parse
# error, PowerShell 7's && and || (which 5.1 rejects), and any byte that is
# not ASCII (5.1 reads a script without a BOM in the ANSI code page).
# $TREE_SITTER_MODULES names the node_modules holding the two packages
# (default: npm's global one).
set -euo pipefail
cd "$(dirname "$0")/.."

sh_script=test/macos/accept.sh
ps_script=test/windows/accept.ps1
failed=0

echo "== shellcheck $sh_script (as sh and as bash), test/acceptance-lint.sh"
if command -v shellcheck >/dev/null; then
	shellcheck --shell=sh "$sh_script" || failed=1
	shellcheck --shell=bash "$sh_script" || failed=1
	shellcheck test/acceptance-lint.sh || failed=1
else
	echo "SKIP shellcheck: not installed (apt-get install -y shellcheck)"
fi
# The syntax as the shells the script runs under parse it, where present.
for sh in dash bash; do
	if command -v "$sh" >/dev/null; then
		"$sh" -n "$sh_script" || failed=1
	fi
done

echo "== PowerShell syntax of $ps_script (tree-sitter-powershell)"
if LC_ALL=C grep -n '[^ -~	]' "$ps_script"; then
	echo "$ps_script: the lines above hold bytes that are not ASCII"
	failed=1
fi
# One error the grammar does not see: "$name:" followed by no name is a
# drive-qualified variable without its variable (write "${name}:" or
# "$name`:"); the scopes and $env: are fine.
# shellcheck disable=SC2016 # PowerShell's $, not the shell's
if sed -E 's/\$(env|script|global|local|private|using|variable|function):/scope/g' "$ps_script" |
	grep -nE '\$[A-Za-z_][A-Za-z0-9_]*:([^A-Za-z0-9_:{]|$)'; then
	echo "$ps_script: the lines above hold \$name: with no variable name after the colon"
	failed=1
fi
modules=${TREE_SITTER_MODULES:-}
if [ -z "$modules" ] && command -v npm >/dev/null; then
	modules=$(npm root -g 2>/dev/null || true)
fi
if ! command -v node >/dev/null; then
	echo "SKIP PowerShell syntax: node is not installed (apt-get install -y nodejs npm)"
elif [ -z "$modules" ] || [ ! -d "$modules/tree-sitter" ] || [ ! -d "$modules/tree-sitter-powershell" ]; then
	where=${modules:-the global node_modules}
	echo "SKIP PowerShell syntax: tree-sitter and tree-sitter-powershell are not in $where (npm install -g tree-sitter@0.25.1 tree-sitter-powershell@0.26.4)"
else
	node --input-type=module - "$modules" "$ps_script" <<'EOF' || failed=1
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { readFileSync } from 'node:fs';
const [modules, file] = process.argv.slice(2);
const require = createRequire(modules + '/');
const Parser = require('tree-sitter');
const lang = (await import(pathToFileURL(require.resolve('tree-sitter-powershell')).href)).default;
const parser = new Parser();
parser.setLanguage(lang);
const src = readFileSync(file, 'utf8');
// tree-sitter's node binding reads a string of 32 KiB or more through a
// callback, in chunks.
const tree = src.length < 32768 ? parser.parse(src) : parser.parse((i) => src.slice(i, i + 8192));
const problems = [];
const walk = (n) => {
	const at = `${file}:${n.startPosition.row + 1}:${n.startPosition.column + 1}`;
	const text = JSON.stringify(n.text.slice(0, 60));
	if (n.type === 'ERROR') problems.push(`${at}: syntax error at ${text}`);
	else if (n.isMissing) problems.push(`${at}: missing ${n.type}`);
	else if (n.type === 'pipeline_chain_tail') problems.push(`${at}: ${text} is PowerShell 7 only`);
	for (const c of n.children) walk(c);
};
walk(tree.rootNode);
for (const p of problems) console.log(p);
if (problems.length) process.exit(1);
console.log(`${file}: parsed, no error`);
EOF
fi

if [ "$failed" -ne 0 ]; then
	echo "acceptance scripts: lint failed"
	exit 1
fi
echo "acceptance scripts: lint ok"
