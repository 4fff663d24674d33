# Acceptance checks of metnos-agent's sandbox on Windows. Prints one line
# per case (PASS, FAIL or SKIP), then "N passed, N failed[, N skipped]";
# exits 0 only when nothing failed. See README.md beside it.
#
#   powershell -NoProfile -ExecutionPolicy Bypass -File accept.ps1 [C:\path\to\metnos-agent.exe]
#
# Windows PowerShell 5.1 and PowerShell 7; built-in cmdlets only. Keep this
# file ASCII: 5.1 reads a script without a BOM in the ANSI code page.
param([string]$Agent = 'metnos-agent')
Set-StrictMode -Version 2
$ErrorActionPreference = 'Stop'

$found = Get-Command -Name $Agent -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
if (-not $found) {
    [Console]::Error.WriteLine("accept.ps1: $Agent not found: give the path to metnos-agent.exe as the first argument")
    exit 2
}
$AgentExe = $found.Path
$Sys32 = Join-Path $env:SystemRoot 'System32'
$HomeDir = $env:USERPROFILE
$Run = [guid]::NewGuid().ToString('N').Substring(0, 12)
$Marker = "metnosaccept$Run"   # letters and digits only: it goes in a WQL LIKE
$T = Join-Path ([IO.Path]::GetTempPath()) "metnos-accept-$Run"
$Granted = Join-Path $T 'granted'
$Other = Join-Path $T 'other'
$SshDir = Join-Path $HomeDir '.ssh'
$Secret = Join-Path $SshDir "metnos-accept-$Run.txt"
$MadeSsh = $false
$Word = $null
$Count = @{ PASS = 0; FAIL = 0; SKIP = 0 }

function New-Token { [guid]::NewGuid().ToString('N') }

function Report([string]$Status, [string]$Case, [string]$Seen) {
    $Count[$Status]++
    $s = ($Seen -replace '\s+', ' ').Trim()
    if ($s.Length -gt 500) { $s = $s.Substring(0, 500) + '...' }
    Write-Output "$Status ${Case}: $s"
}

# Quote-Arg quotes one argument for a Windows command line (the rules Go's
# and the C runtime's parsers follow).
function Quote-Arg([string]$A) {
    if ($A -ne '' -and $A -notmatch '[\s"]') { return $A }
    $q = ($A -replace '(\\*)"', '$1$1\"') -replace '(\\+)$', '$1$1'
    return '"' + $q + '"'
}

# Start-Proc starts File with ArgList, stdin empty, stdout and stderr read
# as it goes; Wait-Proc waits for it and returns Code, Out, Err and, when a
# line of Out is a JSON object, Json.
function Start-Proc([string]$File, [string[]]$ArgList) {
    $psi = New-Object System.Diagnostics.ProcessStartInfo
    $psi.FileName = $File
    $psi.Arguments = (@($ArgList) | ForEach-Object { Quote-Arg $_ }) -join ' '
    $psi.UseShellExecute = $false
    $psi.CreateNoWindow = $true
    $psi.WorkingDirectory = $T
    $psi.RedirectStandardInput = $true
    $psi.RedirectStandardOutput = $true
    $psi.RedirectStandardError = $true
    $psi.StandardOutputEncoding = [Text.Encoding]::UTF8
    $psi.StandardErrorEncoding = [Text.Encoding]::UTF8
    $p = [System.Diagnostics.Process]::Start($psi)
    $p.StandardInput.Close()
    return @{ P = $p; Out = $p.StandardOutput.ReadToEndAsync(); Err = $p.StandardError.ReadToEndAsync() }
}
function Wait-Proc($H) {
    $H.P.WaitForExit()
    $r = @{ Code = $H.P.ExitCode; Out = $H.Out.Result; Err = $H.Err.Result; Json = $null }
    foreach ($line in ($r.Out -split "`r?`n")) {
        if ($line.StartsWith('{')) { try { $r.Json = $line | ConvertFrom-Json } catch { $r.Json = $null } }
    }
    return $r
}
function Invoke-Exec([string[]]$ArgList) { Wait-Proc (Start-Proc $AgentExe (@('exec', '--json') + $ArgList)) }
function Invoke-Plain([string]$File, [string[]]$ArgList) { Wait-Proc (Start-Proc $File $ArgList) }

function Field($O, [string]$Name) {
    if ($null -ne $O -and $O.PSObject.Properties[$Name]) { return $O.PSObject.Properties[$Name].Value }
    return $null
}
# Ran: exec ran the command (it printed a result, not an error).
function Ran($R) { return ($null -ne $R.Json) -and ($null -eq (Field $R.Json 'error')) }
function Printed($R, [string]$Text) { return ($R.Out + $R.Err).Contains($Text) }
function Describe($R) {
    if ($null -eq $R.Json) { return "exit $($R.Code), no JSON result; stderr: $($R.Err)" }
    if (-not (Ran $R)) { return "exit $($R.Code), not run: $(Field $R.Json 'error')" }
    return "exit $($R.Code) in $(Field $R.Json 'sandbox'), stdout '$(Field $R.Json 'stdout')', stderr '$(Field $R.Json 'stderr')'"
}

# Get-ContainerAces lists the entries of AppContainer SIDs (S-1-15-2-...,
# but the two every container shares) on Paths, inherited ones included.
function Get-ContainerAces([string[]]$Paths) {
    foreach ($path in $Paths) {
        if (-not (Test-Path -LiteralPath $path)) { continue }
        try { $rules = (Get-Acl -LiteralPath $path).GetAccessRules($true, $true, [System.Security.Principal.SecurityIdentifier]) }
        catch { "$path|unreadable: $($_.Exception.Message)"; continue }
        foreach ($a in $rules) {
            $sid = $a.IdentityReference.Value
            if ($sid -like 'S-1-15-2-*' -and $sid -ne 'S-1-15-2-1' -and $sid -ne 'S-1-15-2-2') {
                "$path|$sid|$($a.AccessControlType)|$($a.FileSystemRights)|inherited=$($a.IsInherited)"
            }
        }
    }
}
# Get-Marked: the processes whose command line holds the marker, but Except.
function Get-Marked([int]$Except = 0) {
    @(Get-CimInstance -ClassName Win32_Process -Filter "CommandLine LIKE '%$Marker%'" -ErrorAction SilentlyContinue |
        Where-Object { $_.ProcessId -ne $Except -and $_.ProcessId -ne $PID })
}
function Get-Scratch { @(Get-ChildItem -LiteralPath ([IO.Path]::GetTempPath()) -Filter 'metnos-exec-*' -ErrorAction SilentlyContinue | ForEach-Object { $_.Name }) }
# Get-DataDir: the agent's data folder, from doctor when it prints one,
# else as the agent computes it (METNOS_DATA_DIR, else %LOCALAPPDATA%\metnos).
function Get-DataDir {
    $d = Invoke-Plain $AgentExe @('doctor')
    if ($d.Out -match '(?m)^data\s+(\S.*?)\s*$') { return $Matches[1] }
    $v = $env:METNOS_DATA_DIR
    if ($v -and $v.StartsWith('~/')) { return Join-Path $HomeDir $v.Substring(2) }
    if ($v) { return $v }
    return Join-Path $env:LOCALAPPDATA 'metnos'
}

function Case-word {
    $r = Invoke-Exec @('--', 'cmd', '/d', '/c', 'exit', '0')
    $script:Word = Field $r.Json 'sandbox'
    $seen = "sandbox '$Word'; reason: $(Field $r.Json 'reason')"
    if (-not (Ran $r)) { Report FAIL word (Describe $r) }
    elseif ($Word -eq 'appcontainer' -and $r.Code -eq 0) { Report PASS word $seen }
    else { Report FAIL word "$seen (want appcontainer)" }
}

function Case-nucleus-home-grant {
    $tok = New-Token
    [IO.File]::WriteAllText($Secret, "secret $tok`r`n")
    $c = Invoke-Plain (Join-Path $Sys32 'cmd.exe') @('/d', '/c', 'type', $Secret)
    if (-not $c.Out.Contains($tok)) { Report FAIL nucleus-home-grant "control: 'type' outside the sandbox did not print the planted file: $($c.Out) $($c.Err)"; return }
    [Console]::Error.WriteLine("accept.ps1: granting read of $HomeDir (the whole home folder): this can take a while")
    $r = Invoke-Exec @('--read', $HomeDir, '--', 'cmd', '/d', '/c', 'type', $Secret)
    $seen = "--read $HomeDir, type $Secret`: $(Describe $r); outside the sandbox it printed the token"
    if ((Ran $r) -and $r.Code -ne 0 -and -not (Printed $r $tok)) { Report PASS nucleus-home-grant $seen }
    else { Report FAIL nucleus-home-grant $seen }
}

function Case-grant-read {
    $g = New-Token; $o = New-Token
    $gf = Join-Path $Granted 'g.txt'; $of = Join-Path $Other 'o.txt'
    [IO.File]::WriteAllText($gf, $g); [IO.File]::WriteAllText($of, $o)
    $r1 = Invoke-Exec @('--read', $Granted, '--', 'cmd', '/d', '/c', 'type', $gf)
    $r2 = Invoke-Exec @('--read', $Granted, '--', 'cmd', '/d', '/c', 'type', $of)
    $ok1 = (Ran $r1) -and $r1.Code -eq 0 -and (Printed $r1 $g)
    $ok2 = (Ran $r2) -and $r2.Code -ne 0 -and -not (Printed $r2 $o)
    $seen = "granted\g.txt: $(if ($ok1) { 'read' } else { Describe $r1 }); other\o.txt: $(if ($ok2) { 'not readable' } else { Describe $r2 })"
    if ($ok1 -and $ok2) { Report PASS grant-read $seen } else { Report FAIL grant-read $seen }
}

function Case-grant-write {
    $n1 = Join-Path $Granted 'new.txt'; $n2 = Join-Path $Other 'new.txt'
    $w1 = New-Token; $w2 = New-Token
    $r1 = Invoke-Exec @('--write', $Granted, '--', 'cmd', '/d', '/c', 'echo', $w1, '>', $n1)
    $r2 = Invoke-Exec @('--write', $Granted, '--', 'cmd', '/d', '/c', 'echo', $w2, '>', $n2)
    $ok1 = (Test-Path -LiteralPath $n1) -and ([IO.File]::ReadAllText($n1)).Contains($w1)
    $made2 = Test-Path -LiteralPath $n2
    $ok2 = (-not $made2) -and (Ran $r2)
    $d2 = if ($made2) { 'created (' + (Describe $r2) + ')' } elseif ($ok2) { 'absent' } else { 'absent, but not run: ' + (Describe $r2) }
    $seen = "on disk: granted\new.txt $(if ($ok1) { 'written' } else { 'missing (' + (Describe $r1) + ')' }); other\new.txt $d2"
    if ($ok1 -and $ok2) { Report PASS grant-write $seen } else { Report FAIL grant-write $seen }
}

function Case-no-network {
    $probe = 'try { $c = New-Object Net.Sockets.TcpClient; if ($c.ConnectAsync(''1.1.1.1'', 443).Wait(4000)) { ''CONNECTED-OK''; exit 0 }; ''timed out''; exit 2 } catch { ''failed: '' + $_.Exception.GetBaseException().Message; exit 1 }'
    $psArgs = @('-NoProfile', '-NonInteractive', '-Command', $probe)
    $c = Invoke-Plain (Join-Path $Sys32 'WindowsPowerShell\v1.0\powershell.exe') $psArgs
    if (-not $c.Out.Contains('CONNECTED-OK')) { Report SKIP no-network "no network on this machine: outside the sandbox: $($c.Out) $($c.Err)"; return }
    $r = Invoke-Exec (@('--', 'powershell') + $psArgs)
    $n = Invoke-Exec (@('--net', '--', 'powershell') + $psArgs)
    $cut = (Ran $r) -and $r.Code -ne 0 -and -not (Printed $r 'CONNECTED-OK')
    $open = (Ran $n) -and (Printed $n 'CONNECTED-OK')
    $seen = "1.1.1.1:443 without --net: $(Describe $r); with --net: $(if ($open) { 'connected' } else { Describe $n }); outside: connected"
    if ($cut -and $open) { Report PASS no-network $seen }
    elseif ($cut) { Report FAIL no-network "$seen (with --net it fails too: the cut is not shown to be the sandbox's)" }
    else { Report FAIL no-network $seen }
}

function Case-deadline-kills-tree {
    $sw = [System.Diagnostics.Stopwatch]::StartNew()
    $h = Start-Proc $AgentExe @('exec', '--json', '--timeout', '3s', '--', 'cmd', '/d', '/c', 'powershell', '-NoProfile', '-NonInteractive', '-Command', "Start-Sleep -Seconds 60 # $Marker")
    $seenChild = $false
    while (-not $h.P.HasExited) {
        if (@(Get-Marked $h.P.Id | Where-Object { $_.Name -eq 'powershell.exe' }).Count -gt 0) { $seenChild = $true }
        Start-Sleep -Milliseconds 250
    }
    $r = Wait-Proc $h
    $secs = [math]::Round($sw.Elapsed.TotalSeconds, 1)
    Start-Sleep -Seconds 2
    $left = @(Get-Marked)
    $names = ($left | ForEach-Object { "$($_.Name) $($_.ProcessId)" }) -join ', '
    $seen = "exit $($r.Code) after $secs s, timed_out=$(Field $r.Json 'timed_out'), grandchild seen running: $seenChild, alive 2 s later: $(if ($names) { $names } else { 'none' })"
    if ($r.Code -eq 124 -and $seenChild -and $left.Count -eq 0) { Report PASS deadline-kills-tree $seen }
    else { Report FAIL deadline-kills-tree "$seen; stderr: $($r.Err)" }
}

function Case-min-sandbox {
    if (-not $Word) { Report SKIP min-sandbox 'the word case got no sandbox word'; return }
    $r = Invoke-Exec @('--min-sandbox', 'isolated', '--', 'cmd', '/d', '/c', 'exit', '0')
    if ($Word -eq 'appcontainer') {
        if ((Ran $r) -and $r.Code -eq 0) { Report PASS min-sandbox "ran (exit 0) in $(Field $r.Json 'sandbox')" }
        else { Report FAIL min-sandbox "the word is appcontainer but: $(Describe $r)" }
    } elseif ($r.Code -eq 125 -and (Field $r.Json 'refused')) {
        Report PASS min-sandbox "refused with exit 125 where the word is $Word`: $(Field $r.Json 'error')"
    } else { Report FAIL min-sandbox "the word is $Word, want a refusal (125): $(Describe $r)" }
}

function Case-no-leftovers {
    $bad = @()
    $bad += @(Get-ContainerAces $AcePaths | Where-Object { $AcesBefore -notcontains $_ } | ForEach-Object { "entry $_" })
    $ledger = Join-Path (Get-DataDir) 'sandbox-grants'
    $bad += @(Get-ChildItem -LiteralPath $ledger -Filter '*.json' -ErrorAction SilentlyContinue | ForEach-Object { "ledger record $($_.FullName)" })
    $bad += @(Get-Scratch | Where-Object { $ScratchBefore -notcontains $_ } | ForEach-Object { "scratch folder $_" })
    $bad += @(Get-Marked | ForEach-Object { "process $($_.Name) $($_.ProcessId)" })
    $l = if (Test-Path -LiteralPath $ledger) { "ledger $ledger holds no record" } else { "no ledger at $ledger" }
    if ($bad.Count -eq 0) { Report PASS no-leftovers "no new AppContainer entry on $($AcePaths -join ', '); $l; no scratch folder or marked process left" }
    else { Report FAIL no-leftovers ($bad -join '; ') }
}

try {
    New-Item -ItemType Directory -Path $T, $Granted, $Other -Force | Out-Null
    if (-not (Test-Path -LiteralPath $SshDir)) { New-Item -ItemType Directory -Path $SshDir | Out-Null; $MadeSsh = $true }
    $AcePaths = @($T, $Granted, $Other, $HomeDir, $SshDir)
    $AcesBefore = @(Get-ContainerAces $AcePaths)
    $ScratchBefore = Get-Scratch
    foreach ($case in 'word', 'nucleus-home-grant', 'grant-read', 'grant-write', 'no-network', 'deadline-kills-tree', 'min-sandbox', 'no-leftovers') {
        try { & "Case-$case" }
        catch { Report FAIL $case "the script failed: $($_.Exception.Message)" }
    }
} finally {
    foreach ($p in @(Get-Marked)) { Stop-Process -Id $p.ProcessId -Force -ErrorAction SilentlyContinue }
    if (Test-Path -LiteralPath $Secret) { Remove-Item -LiteralPath $Secret -Force -ErrorAction SilentlyContinue }
    if ($MadeSsh -and -not (Get-ChildItem -LiteralPath $SshDir -Force)) { Remove-Item -LiteralPath $SshDir -Force -ErrorAction SilentlyContinue }
    if (Test-Path -LiteralPath $T) { Remove-Item -LiteralPath $T -Recurse -Force -ErrorAction SilentlyContinue }
}

$summary = "$($Count.PASS) passed, $($Count.FAIL) failed"
if ($Count.SKIP -gt 0) { $summary += ", $($Count.SKIP) skipped" }
Write-Output $summary
if ($Count.FAIL -gt 0) { exit 1 }
exit 0
