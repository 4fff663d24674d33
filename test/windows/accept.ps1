# Acceptance checks of metnos-agent's sandbox (with its runs' priority, its
# refusal of dry runs, and the owner's limits file) and of its service (the
# logon task "metnos-agent install" registers) on Windows. Prints one line per
# case (PASS, FAIL or SKIP), then "N passed, N failed[, N skipped]"; exits
# 0 only when nothing failed. See README.md beside it.
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
# The service cases (see Get-ServiceGate).
$Schtasks = Join-Path $Sys32 'schtasks.exe'
$SvcTask = 'MetnosAgent'      # the agent's task
$RustTask = 'MetnosClient'    # the Rust client's, which install takes over from
# The task promises to start the agent again every minute while it is not
# running (its logon trigger repeats every minute, and it restarts every
# minute on failure); the restart case allows 15 s more.
$RestartSec = 60
$RestartSlack = 15
$SvcSkip = $null         # why the service cases are skipped
$SvcInstalled = $false   # this run installed the service: uninstall it at the end
$SvcExe = $null          # what the task runs
$StandIn = $false        # this run made a stand-in pairing in the data folder, to remove at the end
$RustStandIn = $false    # this run registered a stand-in MetnosClient task: delete it at the end
$Started = @()           # agents this run started by hand: stopped at the end
$DataDir = $null         # the agent's data folder, and whether it existed before the run
$DataExisted = $true
# The limits cases (see Get-LimitsGate). The owner's limits file is where
# "metnos-agent limits --json" says (%APPDATA%\metnos\limits.toml); the
# cases that write it back it up first and put it back as it was as soon
# as they are done (and at the end, whatever happened).
$Dry = Join-Path $T 'dry'
$Never = Join-Path $T 'never'
$PowerShell = Join-Path $Sys32 'WindowsPowerShell\v1.0\powershell.exe'
$PrioProbe = @('-NoProfile', '-NonInteractive', '-Command', '[Diagnostics.Process]::GetCurrentProcess().PriorityClass')
$LimitsChecked = $false  # Get-LimitsGate ran
$LimitsSkip = $null      # why the cases that write the limits file are skipped
$LimitsFile = $null      # the owner's limits file
$LimitsBackup = $null    # its bytes before this run wrote it, or $null when there was none
$LimitsWritten = $false  # this run wrote it: Restore-Limits puts it back
$LimitsMadeDir = $false  # this run made its folder: removed when empty again

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

# Start-Proc starts File with ArgList (and the environment variables in
# Vars), stdin empty, stdout and stderr read as it goes; Wait-Proc waits
# for it and returns Code, Out, Err and, when a line of Out is a JSON
# object, Json.
function Start-Proc([string]$File, [string[]]$ArgList, [hashtable]$Vars = @{}) {
    $psi = New-Object System.Diagnostics.ProcessStartInfo
    foreach ($k in $Vars.Keys) { $psi.EnvironmentVariables[$k] = $Vars[$k] }
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
function Invoke-Plain([string]$File, [string[]]$ArgList, [hashtable]$Vars = @{}) { Wait-Proc (Start-Proc $File $ArgList $Vars) }

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

# Get-Limits: what "metnos-agent limits --json" says ($null when it printed
# no JSON); Get-LimitSetting: the value in force of one of its settings,
# as TOML writes it ('"low"'), or $null.
function Get-Limits {
    $r = Invoke-Plain $AgentExe @('limits', '--json')
    try { return ($r.Out | ConvertFrom-Json) } catch { return $null }
}
function Get-LimitSetting($L, [string]$Key) {
    foreach ($s in @(Field $L 'settings')) { if ((Field $s 'key') -eq $Key) { return [string](Field $s 'value') } }
    return $null
}
# Get-LimitsGate says why the cases that write the owner's limits file
# cannot run here, or $null, and sets $LimitsFile. An agent that runs
# would put the file this run writes in force for its own invocations
# (it looks at the file after every poll) and record the change, and
# then its putting back, in its audit log: they run only where none runs.
# Windows makes no check of the file's access list (docs/limits.md, "Who
# can write it"; internal/config/limits_windows.go): the file gets the
# profile folder's, which only this user and the administrators can write.
function Get-LimitsGate {
    $f = Field (Get-Limits) 'file'
    if (-not $f) { return "metnos-agent limits --json named no limits file: $((Invoke-Plain $AgentExe @('limits')).Err)" }
    $script:LimitsFile = [string]$f
    $st = Get-Status
    if ($st['running'] -like 'yes*') { return "an agent runs here ($(Status-Line $st)): it would put the limits this case writes in $LimitsFile in force for its own invocations and record the change in its audit log; stop it first" }
    return $null
}
function Test-LimitsGate([string]$Case) {
    if (-not $LimitsChecked) { $script:LimitsSkip = Get-LimitsGate; $script:LimitsChecked = $true }
    if ($LimitsSkip) { Report SKIP $Case $LimitsSkip; return $false }
    return $true
}
# Set-Limits writes Text as the owner's limits file, having kept what was
# there (and made its folder when there was none); Restore-Limits puts
# back what was there, and says how that went.
function Set-Limits([string]$Text) {
    if (-not $LimitsWritten) {
        $dir = Split-Path -Parent $LimitsFile
        if (Test-Path -LiteralPath $LimitsFile) { $script:LimitsBackup = [IO.File]::ReadAllBytes($LimitsFile) } else { $script:LimitsBackup = $null }
        if (-not (Test-Path -LiteralPath $dir)) { New-Item -ItemType Directory -Path $dir -Force | Out-Null; $script:LimitsMadeDir = $true }
        $script:LimitsWritten = $true
    }
    [IO.File]::WriteAllText($LimitsFile, $Text)
}
function Restore-Limits {
    if (-not $LimitsWritten) { return 'untouched' }
    $dir = Split-Path -Parent $LimitsFile
    if ($null -ne $LimitsBackup) { [IO.File]::WriteAllBytes($LimitsFile, $LimitsBackup) }
    elseif (Test-Path -LiteralPath $LimitsFile) { Remove-Item -LiteralPath $LimitsFile -Force }
    if ($LimitsMadeDir -and -not (Get-ChildItem -LiteralPath $dir -Force)) { Remove-Item -LiteralPath $dir -Force; $script:LimitsMadeDir = $false }
    $script:LimitsWritten = $false
    if ($null -eq $LimitsBackup) {
        if (Test-Path -LiteralPath $LimitsFile) { return "still there, though there was none before" }
        return 'removed (there was none before)'
    }
    $now = [IO.File]::ReadAllBytes($LimitsFile)
    if ([Convert]::ToBase64String($now) -eq [Convert]::ToBase64String($LimitsBackup)) { return 'put back as it was' }
    return 'NOT as it was before'
}
# Toml-String: S as a TOML basic string.
function Toml-String([string]$S) { return '"' + ($S -replace '\\', '\\' -replace '"', '\"') + '"' }
function Get-Applied($R) { return (@(Field (Field $R.Json 'priority') 'applied') -join '; ') }
function Get-Missing($R) { return (@(Field (Field $R.Json 'priority') 'missing') -join '; ') }

# Case-priority-default: a command in the sandbox runs at the priority
# class below normal (the job's, with a CPU weight of 3 of 9), where the
# same command outside it runs at Normal: the change is the agent's.
function Case-priority-default {
    $cpu = Get-LimitSetting (Get-Limits) 'priority.cpu'
    if ($cpu -and $cpu -ne '"low"') { Report SKIP priority-default "the limits in force say priority.cpu = $cpu (metnos-agent limits): this case checks the default, low"; return }
    $c = Invoke-Plain $PowerShell $PrioProbe
    $ctl = $c.Out.Trim()
    if ($ctl -ne 'Normal') { Report SKIP priority-default "control: powershell outside the sandbox runs at the class '$ctl', not Normal, so the agent's change cannot be told from this script's own: run the script at normal priority $($c.Err)"; return }
    $r = Invoke-Exec (@('--', 'powershell') + $PrioProbe)
    $cls = ([string](Field $r.Json 'stdout')).Trim()
    $ap = Get-Applied $r
    $seen = "class inside the sandbox: '$cls', outside: Normal; priority applied: $ap; $(Describe $r); not applied: $(Get-Missing $r)"
    if ((Ran $r) -and $r.Code -eq 0 -and $cls -eq 'BelowNormal' -and $ap.Contains('priority class below normal') -and $ap.Contains('job CPU weight 3 of 9')) { Report PASS priority-default $seen }
    else { Report FAIL priority-default "$seen (want BelowNormal, and the report naming the class below normal and the CPU weight 3 of 9)" }
}

# Case-priority-from-limits: with the owner's limits file saying
# [priority] cpu = "background", the same command runs at the Idle class
# (CPU weight 1 of 9); the file is put back as it was at once.
function Case-priority-from-limits {
    if (-not (Test-LimitsGate 'priority-from-limits')) { return }
    Set-Limits "[priority]`r`ncpu = `"background`"`r`n"
    $l = Get-Limits
    $r = Invoke-Exec (@('--', 'powershell') + $PrioProbe)
    $back = Restore-Limits
    $inForce = (Field $l 'in_force') -eq $true
    $cpu = Get-LimitSetting $l 'priority.cpu'
    $cls = ([string](Field $r.Json 'stdout')).Trim()
    $ap = Get-Applied $r
    $seen = "class inside the sandbox: '$cls'; priority applied: $ap; ${LimitsFile}: cpu = `"background`" in force $inForce (priority.cpu $cpu), then $back; $(Describe $r); not applied: $(Get-Missing $r) $(Field $l 'error')"
    if ($inForce -and (Ran $r) -and $r.Code -eq 0 -and $cls -eq 'Idle' -and $ap.Contains('priority class idle') -and $ap.Contains('job CPU weight 1 of 9') -and $back -ne 'NOT as it was before' -and -not $back.StartsWith('still')) { Report PASS priority-from-limits $seen }
    else { Report FAIL priority-from-limits "$seen (want Idle, and the report naming the idle class and the CPU weight 1 of 9)" }
}

# Case-dry-run-refused: a dry run needs a copy-on-write layer, which only
# Linux gives: exec --dry-run refuses (125, saying why) and runs nothing,
# where the same command without --dry-run writes its file.
function Case-dry-run-refused {
    $tok = New-Token
    $f1 = Join-Path $Dry 'dry.txt'; $f2 = Join-Path $Dry 'real.txt'
    $r = Invoke-Exec @('--dry-run', '--write', $Dry, '--', 'cmd', '/d', '/c', 'echo', $tok, '>', $f1)
    $made = Test-Path -LiteralPath $f1
    $c = Invoke-Exec @('--write', $Dry, '--', 'cmd', '/d', '/c', 'echo', $tok, '>', $f2)
    $wrote = (Test-Path -LiteralPath $f2) -and ([IO.File]::ReadAllText($f2)).Contains($tok)
    $why = [string](Field $r.Json 'error')
    $seen = "--dry-run: exit $($r.Code), refused $(Field $r.Json 'refused'), said: $(if ($why) { $why } else { $r.Err }); dry\dry.txt $(if ($made) { 'CREATED' } else { 'absent' }); without --dry-run: dry\real.txt $(if ($wrote) { 'written' } else { 'missing (' + (Describe $c) + ')' })"
    if ($r.Code -eq 125 -and (Field $r.Json 'refused') -eq $true -and $why.Contains('copy-on-write') -and -not $made -and $wrote) { Report PASS dry-run-refused $seen }
    else { Report FAIL dry-run-refused "$seen (want exit 125 saying why, no file, and the control's file written)" }
}

# Case-never-from-limits: a folder the owner's limits file lists in never
# joins the nucleus: exec --read of the folder above it cannot read a file
# in it, where it could before the file said so. Only never (and
# [network] and [priority]) of the file apply to exec: mode (readonly,
# preview) and [executors] are about executors, which exec does not run
# (docs/limits.md, "What it does not do"; cli/exec.go takes no mode), so
# no case here writes a mode: run applies it, to a server's invocations.
function Case-never-from-limits {
    if (-not (Test-LimitsGate 'never-from-limits')) { return }
    $tok = New-Token
    $sf = Join-Path $Never 'secret.txt'
    [IO.File]::WriteAllText($sf, $tok)
    $c = Invoke-Exec @('--read', $T, '--', 'cmd', '/d', '/c', 'type', $sf)
    if (-not ((Ran $c) -and $c.Code -eq 0 -and (Printed $c $tok))) { Report FAIL never-from-limits "control: before the limits file listed it, --read $T could not read never\secret.txt: $(Describe $c)"; return }
    Set-Limits "never = [$(Toml-String $Never)]`r`n"
    $l = Get-Limits
    $r = Invoke-Exec @('--read', $T, '--', 'cmd', '/d', '/c', 'type', $sf)
    $back = Restore-Limits
    $inForce = (Field $l 'in_force') -eq $true
    $hidden = (Ran $r) -and $r.Code -ne 0 -and -not (Printed $r $tok)
    $refused = (-not (Ran $r)) -and $r.Code -eq 125 -and -not (Printed $r $tok)
    $seen = "--read $T, type never\secret.txt: $(Describe $r); before the limits file listed never\, it printed the token; ${LimitsFile}: never = [$Never] in force $inForce, then $back $(Field $l 'error')"
    if ($inForce -and ($hidden -or $refused) -and $back -ne 'NOT as it was before' -and -not $back.StartsWith('still')) { Report PASS never-from-limits $seen }
    else { Report FAIL never-from-limits $seen }
}

# Get-Status runs "metnos-agent status" (with the environment variables in
# Vars) and returns its "name: value" lines as a table, and Text, all of it.
function Get-Status([hashtable]$Vars = @{}) {
    $r = Invoke-Plain $AgentExe @('status') $Vars
    $st = @{ Text = (($r.Out + ' ' + $r.Err) -replace '\s+', ' ').Trim() }
    foreach ($line in ($r.Out -split "`r?`n")) {
        if ($line -match '^([a-z][a-z ]*?):\s+(.*)$') { $st[$Matches[1]] = $Matches[2].Trim() }
    }
    return $st
}
function Status-Line($St) {
    if ($null -eq $St['installed']) { return "status said: $($St['Text'])" }
    return "installed $($St['installed']), enabled $($St['enabled']), running $($St['running']), rust client $($St['rust client'])"
}
# Get-TaskRow: schtasks' row for the task Name, or $null when there is none.
function Get-TaskRow([string]$Name) {
    $q = Invoke-Plain $Schtasks @('/Query', '/TN', $Name, '/FO', 'CSV', '/NH')
    if ($q.Code -ne 0) { return $null }
    foreach ($line in ($q.Out -split "`r?`n")) {
        if ($line.StartsWith("`"\$Name`",", [StringComparison]::OrdinalIgnoreCase)) { return $line.Trim() }
    }
    return $null
}
# Get-TaskInfo: what Task Scheduler says of the agent's task run: its
# status, last run and result, next run (English labels; all of it else).
function Get-TaskInfo {
    $q = Invoke-Plain $Schtasks @('/Query', '/TN', $SvcTask, '/V', '/FO', 'LIST')
    $lines = @($q.Out -split "`r?`n" | Where-Object { $_ -match '^(Status|Last Run Time|Last Result|Next Run Time|Scheduled Task State):' })
    if ($lines.Count -gt 0) { return ($lines -join '; ') }
    return "$($q.Out) $($q.Err)"
}
# Get-TaskExe: the agent the task runs, from the copy of its XML install
# keeps in the data folder (the path install resolved); else $AgentExe.
function Get-TaskExe {
    $x = Join-Path $DataDir "$SvcTask.xml"
    try {
        $doc = [xml](Get-Content -LiteralPath $x -Raw)
        $exec = @($doc.Task.Actions.Exec) | Select-Object -Last 1
        if ($exec.Command) { return [string]$exec.Command }
    } catch { }
    return $AgentExe
}
# Get-AgentProcs: the processes running Exe with "run" as its last word.
function Get-AgentProcs([string]$Exe) {
    $leaf = [IO.Path]::GetFileName($Exe) -replace "'", "''"
    @(Get-CimInstance -ClassName Win32_Process -Filter "Name = '$leaf'" -ErrorAction SilentlyContinue |
        Where-Object { $_.ExecutablePath -eq $Exe -and $_.CommandLine -match '\srun\s*$' })
}
function Describe-Procs($Procs) {
    $d = (@($Procs) | ForEach-Object { "$($_.ProcessId)" }) -join ', '
    if ($d) { return $d }
    return 'none'
}
# New-StandInPairing makes Dir a paired device's data folder: a new device
# key, and a pairing with a server at 127.0.0.1:9, where nothing answers
# (the agent runs, and polls it again and again).
function New-StandInPairing([string]$Dir) {
    New-Item -ItemType Directory -Path $Dir -Force | Out-Null
    $seed = New-Object byte[] 32
    [Security.Cryptography.RandomNumberGenerator]::Create().GetBytes($seed)
    [IO.File]::WriteAllBytes((Join-Path $Dir 'key'), $seed)
    $json = '{"device_id":"accept-standin-' + $Run + '","device_name":"accept.ps1 stand-in","server_url":"http://127.0.0.1:9","server_public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}'
    [IO.File]::WriteAllText((Join-Path $Dir 'state.json'), $json)
}
# Wait-Running polls status (with Vars) until it says running, Secs at most
# (or until Proc, the agent awaited, has exited).
function Wait-Running([int]$Secs, [hashtable]$Vars = @{}, $Proc = $null) {
    $sw = [System.Diagnostics.Stopwatch]::StartNew()
    do {
        $st = Get-Status $Vars
        if ($st['running'] -like 'yes*' -or ($null -ne $Proc -and $Proc.HasExited)) { break }
        Start-Sleep -Milliseconds 500
    } while ($sw.Elapsed.TotalSeconds -lt $Secs)
    return $st
}

# Get-ServiceGate says why the service cases cannot run here, or $null.
# They install, kill and remove the agent's logon task, so they run only
# where it is not installed, no agent runs and the Rust client's task is
# not there (install would disable it). On a device not paired, the agent
# gets a stand-in pairing, in a data folder the script removes at the end:
# only where that folder did not exist before the script ran.
function Get-ServiceGate {
    if ($env:METNOS_DATA_DIR -or $env:METNOS_CACHE_DIR) { return 'METNOS_DATA_DIR or METNOS_CACHE_DIR is set, and a scheduled task cannot carry them: run the script without them' }
    $st = Get-Status
    if ($st['installed'] -ne 'no') { return "the agent's service is installed here already ($(Status-Line $st)): these cases would replace and remove it; run them where it is not installed" }
    if ($st['running'] -ne 'no') { return "an agent runs here already (running: $($st['running'])): stop it first" }
    if ($st['rust client'] -ne 'none') { return "the Rust client's service is here ($($st['rust client'])): install would disable it" }
    $w = Invoke-Plain $AgentExe @('whoami')
    if ($w.Out -match '(?m)^paired:\s+no') {
        if ($DataExisted) { return "this device is not paired and its data folder $DataDir exists: a stand-in pairing is only made in a data folder the script can remove afterwards; pair the device, or move $DataDir away" }
        New-StandInPairing $DataDir
        $script:StandIn = $true
    }
    return $null
}

function Case-service-install {
    $script:SvcSkip = Get-ServiceGate
    if ($SvcSkip) { Report SKIP service-install $SvcSkip; return }
    $r = Invoke-Plain $AgentExe @('install')
    $script:SvcInstalled = $true
    $script:SvcExe = Get-TaskExe
    $sw = [System.Diagnostics.Stopwatch]::StartNew()
    $st = Wait-Running 30
    $secs = [math]::Round($sw.Elapsed.TotalSeconds, 1)
    $row = Get-TaskRow $SvcTask
    $procs = @(Get-AgentProcs $SvcExe)
    $seen = "install exit $($r.Code); $secs s later status: $(Status-Line $st); schtasks: $(if ($row) { $row } else { "no task $SvcTask" }); agent processes of ${SvcExe}: $(Describe-Procs $procs); install said: $($r.Out) $($r.Err)"
    if ($r.Code -eq 0 -and $st['installed'] -eq 'yes' -and $st['enabled'] -eq 'yes' -and $st['running'] -like 'yes*' -and $row -and $procs.Count -eq 1) { Report PASS service-install $seen }
    else { Report FAIL service-install $seen }
}

function Case-service-restart {
    if ($SvcSkip) { Report SKIP service-restart $SvcSkip; return }
    $procs = @(Get-AgentProcs $SvcExe)
    if ($procs.Count -ne 1) { Report FAIL service-restart "want the one agent process of $SvcExe to kill, found: $(Describe-Procs $procs)"; return }
    $old = $procs[0].ProcessId
    Stop-Process -Id $old -Force
    $limit = $RestartSec + $RestartSlack
    $sw = [System.Diagnostics.Stopwatch]::StartNew()
    $new = $null
    # Watched a while past the limit, to say how late a late start is.
    while ($sw.Elapsed.TotalSeconds -lt $limit + 45) {
        Start-Sleep -Seconds 1
        $p = @(Get-AgentProcs $SvcExe | Where-Object { $_.ProcessId -ne $old })
        if ($p.Count -gt 0) { $new = $p[0].ProcessId; break }
    }
    $secs = [math]::Round($sw.Elapsed.TotalSeconds)
    $st = Wait-Running 10
    $seen = "killed agent process $old (Stop-Process -Force); "
    if ($new) { $seen += "Task Scheduler started process $new $secs s later (the task promises a start every $RestartSec s while it is not running; allowed $limit s); status: $(Status-Line $st)" }
    else { $seen += "no agent $secs s later; status: $(Status-Line $st); task: $(Get-TaskInfo)" }
    if ($new -and $secs -le $limit -and $st['running'] -like 'yes*') { Report PASS service-restart $seen }
    else { Report FAIL service-restart $seen }
}

function Case-service-logon {
    Report SKIP service-logon 'logging off and on cannot be scripted from inside the session; to check it by hand: metnos-agent install, log off, log on, metnos-agent status (want running: yes), then metnos-agent uninstall'
}

function Case-service-uninstall {
    if ($SvcSkip) { Report SKIP service-uninstall $SvcSkip; return }
    $r = Invoke-Plain $AgentExe @('uninstall')
    if ($r.Code -eq 0) { $script:SvcInstalled = $false }
    $sw = [System.Diagnostics.Stopwatch]::StartNew()
    do {
        $left = @(Get-AgentProcs $SvcExe)
        if ($left.Count -eq 0) { break }
        Start-Sleep -Milliseconds 500
    } while ($sw.Elapsed.TotalSeconds -lt 15)
    $row = Get-TaskRow $SvcTask
    $xml = Join-Path $DataDir "$SvcTask.xml"
    $xmlLeft = Test-Path -LiteralPath $xml
    $st = Get-Status
    $seen = "uninstall exit $($r.Code); task ${SvcTask}: $(if ($row) { "still there: $row" } else { 'gone' }); agent processes: $(Describe-Procs $left); status: $(Status-Line $st); ${xml}: $(if ($xmlLeft) { 'left' } else { 'gone' }); uninstall said: $($r.Out) $($r.Err)"
    if ($r.Code -eq 0 -and -not $row -and -not $xmlLeft -and $left.Count -eq 0 -and $st['installed'] -eq 'no' -and $st['running'] -eq 'no') { Report PASS service-uninstall $seen }
    else { Report FAIL service-uninstall $seen }
}

# Case-service-takeover: with a stand-in of the Rust client's task
# registered, install disables it (and keeps it), and status says so.
function Case-service-takeover {
    if ($SvcSkip) { Report SKIP service-takeover $SvcSkip; return }
    if (Get-TaskRow $RustTask) { Report SKIP service-takeover "a task $RustTask (the Rust client's) is registered here: the case registers a stand-in under that name"; return }
    $c = Invoke-Plain $Schtasks @('/Create', '/TN', $RustTask, '/TR', "$(Join-Path $Sys32 'cmd.exe') /d /c exit 0", '/SC', 'ONCE', '/ST', '00:00', '/F')
    if ($c.Code -ne 0) { Report FAIL service-takeover "could not register a stand-in $RustTask task: $($c.Out) $($c.Err)"; return }
    $script:RustStandIn = $true
    $r = Invoke-Plain $AgentExe @('install')
    $script:SvcInstalled = $true
    $st = Wait-Running 30
    $rustRow = Get-TaskRow $RustTask
    $u = Invoke-Plain $AgentExe @('uninstall')
    if ($u.Code -eq 0) { $script:SvcInstalled = $false }
    $kept = Get-TaskRow $RustTask
    $d = Invoke-Plain $Schtasks @('/Delete', '/TN', $RustTask, '/F')
    if ($d.Code -eq 0) { $script:RustStandIn = $false }
    $seen = "with a stand-in $RustTask task registered, install exit $($r.Code); status: $(Status-Line $st); schtasks: $(if ($rustRow) { $rustRow } else { "no task $RustTask" }); after uninstall (exit $($u.Code)) the $RustTask task is $(if ($kept) { 'kept' } else { 'gone' }); install said: $($r.Out) $($r.Err)"
    if ($r.Code -eq 0 -and $r.Out.Contains('taking over from the Rust client') -and $st['rust client'] -eq "task $RustTask (enabled: no)" -and
        $rustRow -match '"Disabled"' -and $st['installed'] -eq 'yes' -and $st['running'] -like 'yes*' -and $u.Code -eq 0 -and $kept) { Report PASS service-takeover $seen }
    else { Report FAIL service-takeover $seen }
}

# Case-uninstall-purge-refused: with an agent running (started by hand, on
# a data folder of this run's with a stand-in pairing), uninstall --purge
# refuses and keeps the key; once it is stopped, it removes the folder.
function Case-uninstall-purge-refused {
    $st = Get-Status
    if ($st['installed'] -ne 'no') { Report SKIP uninstall-purge-refused "the agent's service is installed here ($(Status-Line $st)): uninstall --purge would remove it"; return }
    $pd = Join-Path $T 'purge\metnos'
    New-StandInPairing $pd
    $vars = @{ METNOS_DATA_DIR = $pd; METNOS_CACHE_DIR = (Join-Path $T 'purge\cache\metnos') }
    $h = Start-Proc $AgentExe @('run') $vars
    $script:Started += $h.P
    $s1 = Wait-Running 30 $vars $h.P
    $r = Invoke-Plain $AgentExe @('uninstall', '--purge') $vars
    $kept = Test-Path -LiteralPath (Join-Path $pd 'key')
    Stop-Process -Id $h.P.Id -Force -ErrorAction SilentlyContinue
    $ran = Wait-Proc $h
    $r2 = Invoke-Plain $AgentExe @('uninstall', '--purge') $vars
    $gone = -not (Test-Path -LiteralPath $pd)
    $said = (($r.Out + ' ' + $r.Err) -replace '\s+', ' ').Trim()
    $seen = "an agent on $pd, running: $($s1['running']); uninstall --purge: exit $($r.Code), the key $(if ($kept) { 'kept' } else { 'removed' }); once the agent was stopped, uninstall --purge: exit $($r2.Code), the folder $(if ($gone) { 'removed' } else { 'left' }); the first uninstall --purge said: $said"
    if ($s1['running'] -notlike 'yes*') { $seen += "; the agent said: $($ran.Err)" }
    if ($s1['running'] -like 'yes*' -and $r.Code -ne 0 -and $said.Contains('still holds') -and $kept -and $r2.Code -eq 0 -and $gone) { Report PASS uninstall-purge-refused $seen }
    else { Report FAIL uninstall-purge-refused $seen }
}

try {
    New-Item -ItemType Directory -Path $T, $Granted, $Other, $Dry, $Never -Force | Out-Null
    $DataDir = Get-DataDir
    $DataExisted = Test-Path -LiteralPath $DataDir
    if (-not (Test-Path -LiteralPath $SshDir)) { New-Item -ItemType Directory -Path $SshDir | Out-Null; $MadeSsh = $true }
    $AcePaths = @($T, $Granted, $Other, $Dry, $Never, $HomeDir, $SshDir)
    $AcesBefore = @(Get-ContainerAces $AcePaths)
    $ScratchBefore = Get-Scratch
    foreach ($case in 'word', 'nucleus-home-grant', 'grant-read', 'grant-write', 'no-network', 'deadline-kills-tree', 'min-sandbox',
        'priority-default', 'priority-from-limits', 'dry-run-refused', 'never-from-limits', 'no-leftovers',
        'service-install', 'service-restart', 'service-logon', 'service-uninstall', 'service-takeover', 'uninstall-purge-refused') {
        try { & "Case-$case" }
        catch { Report FAIL $case "the script failed: $($_.Exception.Message)" }
        # A case that failed midway does not leave its limits file to the next.
        finally { if ($LimitsWritten) { try { Restore-Limits | Out-Null } catch { } } }
    }
} finally {
    try { Restore-Limits | Out-Null }
    catch {
        $kept = Join-Path ([IO.Path]::GetTempPath()) "metnos-limits-before-accept-$Run.toml"
        if ($null -ne $LimitsBackup) { [IO.File]::WriteAllBytes($kept, $LimitsBackup); $what = "copy $kept over it" } else { $what = 'remove it (there was none before the run)' }
        [Console]::Error.WriteLine("accept.ps1: could not put back the limits file ${LimitsFile}: $($_.Exception.Message); $what")
    }
    foreach ($p in @(Get-Marked)) { Stop-Process -Id $p.ProcessId -Force -ErrorAction SilentlyContinue }
    foreach ($p in $Started) { if (-not $p.HasExited) { Stop-Process -Id $p.Id -Force -ErrorAction SilentlyContinue } }
    try {
        if ($SvcInstalled) { Invoke-Plain $AgentExe @('uninstall') | Out-Null }
        if ($RustStandIn) { Invoke-Plain $Schtasks @('/Delete', '/TN', $RustTask, '/F') | Out-Null }
    } catch { [Console]::Error.WriteLine("accept.ps1: removing the service this run installed: $($_.Exception.Message); run metnos-agent uninstall (and schtasks /Delete /TN $RustTask /F if status shows a stand-in)") }
    if ($StandIn -and (Test-Path -LiteralPath $DataDir)) {
        try { Remove-Item -LiteralPath $DataDir -Recurse -Force }
        catch { [Console]::Error.WriteLine("accept.ps1: could not remove the stand-in pairing's data folder $DataDir (it did not exist before): $($_.Exception.Message)") }
    }
    if (Test-Path -LiteralPath $Secret) { Remove-Item -LiteralPath $Secret -Force -ErrorAction SilentlyContinue }
    if ($MadeSsh -and -not (Get-ChildItem -LiteralPath $SshDir -Force)) { Remove-Item -LiteralPath $SshDir -Force -ErrorAction SilentlyContinue }
    if (Test-Path -LiteralPath $T) { Remove-Item -LiteralPath $T -Recurse -Force -ErrorAction SilentlyContinue }
}

$summary = "$($Count.PASS) passed, $($Count.FAIL) failed"
if ($Count.SKIP -gt 0) { $summary += ", $($Count.SKIP) skipped" }
Write-Output $summary
if ($Count.FAIL -gt 0) { exit 1 }
exit 0
