// Command metnos-refserver runs the Go reference server of the Metnos
// device protocol (package refserver) for tests and demos. It is not a
// Metnos server: no TLS, no users, state in memory only.
//
//	metnos-refserver serve --dir DIR [--addr 127.0.0.1:8765] [--executors DIR] [--shim DIR] [--runtime DIR] [--mirror DIR]
//	metnos-refserver token [--server URL] [--ttl 600] NAME
//	metnos-refserver join [--server URL] [--platform auto|linux|windows] [--ttl 1800] [--json] NAME
//	metnos-refserver publish --mirror DIR --version V --target T [--component metnos-agent] [--installers] BINARY
//	metnos-refserver enqueue [--server URL] [--turn T] [--reversibility R] [--deadline-ms N] [--id ID] DEVICE EXECUTOR ARGS_JSON
//	metnos-refserver get [--server URL] ID
//	metnos-refserver undo [--server URL] DEVICE TURN
//
// serve keeps the server's author key in DIR/keys/author_priv.bin (32 raw
// bytes, created when missing), prints the base URL and serves the
// device endpoints plus a loopback-only admin API under /admin/, which
// the other subcommands call. publish works on a mirror directory, not
// on a server: the server reads the mirror on every request (see
// docs/publishing.md).
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/metnos/agent/examples"
	"github.com/metnos/agent/refserver"
)

const usage = `usage:
  metnos-refserver serve --dir DIR [--addr 127.0.0.1:8765] [--executors DIR] [--shim DIR] [--runtime DIR] [--mirror DIR]
  metnos-refserver token [--server URL] [--ttl SECONDS] NAME
  metnos-refserver join [--server URL] [--platform auto|linux|windows] [--ttl SECONDS] [--json] NAME
  metnos-refserver publish --mirror DIR --version V --target T [--component metnos-agent] [--installers] BINARY
  metnos-refserver enqueue [--server URL] [--turn T] [--reversibility R] [--deadline-ms N] [--id ID] DEVICE EXECUTOR ARGS_JSON
  metnos-refserver get [--server URL] ID
  metnos-refserver undo [--server URL] DEVICE TURN

A reference server of the Metnos device protocol for tests and demos:
not a Metnos server, no TLS, state in memory.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stdout, stderr)
	case "publish":
		err = publish(args[1:], stdout, stderr)
	case "join":
		err = join(args[1:], stdout, stderr)
	case "token", "enqueue", "get", "undo":
		err = client(args[0], args[1:], stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "metnos-refserver: unknown command %q\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "metnos-refserver %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("dir", "", "state directory (the author key lives in DIR/keys)")
	addr := fl.String("addr", "127.0.0.1:8765", "listen address")
	executors := fl.String("executors", "", "folder of executors to sign and serve (one sub-folder each; default: the samples of package examples)")
	shim := fl.String("shim", "", "folder of shim files to sign and serve (default: the shim of package examples)")
	runtimeDir := fl.String("runtime", "", "folder of Python runtime *.tar.gz files")
	mirror := fl.String("mirror", "", "client mirror folder (manifest.json, builds, install.sh/.ps1; see publish)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *dir == "" || fl.NArg() != 0 {
		return errors.New("--dir DIR is required and no positional arguments are taken")
	}
	key, err := loadOrCreateKey(*dir)
	if err != nil {
		return err
	}
	cfg := refserver.Config{Key: key, RuntimeDir: *runtimeDir, Mirror: *mirror,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	cfg.Executors, cfg.Shim = examples.Executors, examples.Shim
	if *executors != "" {
		cfg.Executors = os.DirFS(*executors)
	}
	if *shim != "" {
		cfg.Shim = os.DirFS(*shim)
	}
	srv, err := refserver.New(cfg)
	if err != nil {
		return err
	}
	url, err := srv.Start(*addr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, url)
	<-ctx.Done()
	return srv.Close()
}

// loadOrCreateKey reads DIR/keys/author_priv.bin (32 raw seed bytes) or
// creates it (0600, directory 0700) with author_pub.bin beside it.
func loadOrCreateKey(dir string) (ed25519.PrivateKey, error) {
	keys := filepath.Join(dir, "keys")
	privPath := filepath.Join(keys, "author_priv.bin")
	seed, err := os.ReadFile(privPath)
	switch {
	case err == nil:
		if len(seed) != ed25519.SeedSize {
			return nil, fmt.Errorf("%s is %d bytes, want %d raw seed bytes: delete it to make a new key", privPath, len(seed), ed25519.SeedSize)
		}
		return ed25519.NewKeyFromSeed(seed), nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return nil, err
	}
	seed = make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, err
	}
	key := ed25519.NewKeyFromSeed(seed)
	if err := os.WriteFile(privPath, seed, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(keys, "author_pub.bin"), key.Public().(ed25519.PublicKey), 0o644); err != nil {
		return nil, err
	}
	return key, nil
}
