// Command registry is the simulator's OCI registry: go-containerregistry's registry handler (the
// distribution API: blobs on disk, manifests in memory) behind TLS and HTTP basic auth checked
// against an htpasswd file of bcrypt hashes. Test infrastructure only; built by build.sh.
//
//	registry serve --addr 127.0.0.1:0 --tls-cert C --tls-key K --htpasswd F --storage DIR
//	registry htpasswd USER < password     # prints USER:<bcrypt hash>, an htpasswd line
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"golang.org/x/crypto/bcrypt"
)

const realm = "gpu-operator-sim-registry"

func main() {
	if len(os.Args) < 2 {
		fail("usage: registry serve|htpasswd ...")
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "htpasswd":
		if len(os.Args) != 3 || os.Args[2] == "" || strings.Contains(os.Args[2], ":") {
			fail("usage: registry htpasswd USER < password (USER without ':')")
		}
		password, err := io.ReadAll(os.Stdin)
		if err != nil {
			fail("reading the password from stdin: %v", err)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(strings.TrimRight(string(password), "\r\n")), bcrypt.DefaultCost)
		if err != nil {
			fail("hashing: %v", err)
		}
		fmt.Printf("%s:%s\n", os.Args[2], hash)
	default:
		fail("unknown command %q: use serve or htpasswd", os.Args[1])
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "registry: "+format+"\n", args...)
	os.Exit(2)
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "HOST:PORT to listen on (port 0: any free port)")
	cert := fs.String("tls-cert", "", "serving certificate (PEM), required")
	key := fs.String("tls-key", "", "its private key (PEM), required")
	htpasswd := fs.String("htpasswd", "", "htpasswd file of USER:<bcrypt hash> lines, required")
	storage := fs.String("storage", "", "directory for blobs, required")
	_ = fs.Parse(args)
	for name, v := range map[string]string{"--tls-cert": *cert, "--tls-key": *key, "--htpasswd": *htpasswd, "--storage": *storage} {
		if v == "" {
			fail("%s is required", name)
		}
	}
	users, err := readHtpasswd(*htpasswd)
	if err != nil {
		fail("%v", err)
	}
	if err := os.MkdirAll(*storage, 0o700); err != nil {
		fail("storage: %v", err)
	}
	logger := log.New(os.Stdout, "", log.LstdFlags|log.LUTC)
	handler := registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(*storage)),
		registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0)))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fail("listen %s: %v", *addr, err)
	}
	// The line the simulator waits for: the address actually bound.
	fmt.Printf("serving https://%s\n", ln.Addr())
	srv := &http.Server{Handler: authenticate(users, handler, logger), ReadHeaderTimeout: 30 * time.Second}
	if err := srv.ServeTLS(ln, *cert, *key); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fail("serve: %v", err)
	}
}

func readHtpasswd(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--htpasswd: %w", err)
	}
	defer f.Close()
	users := map[string][]byte{}
	scanner := bufio.NewScanner(f)
	for n := 1; scanner.Scan(); n++ {
		line := strings.TrimSpace(scanner.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, hash, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(hash, "$2") {
			return nil, fmt.Errorf("--htpasswd %s line %d: want USER:<bcrypt hash> (make one with `registry htpasswd USER`)", path, n)
		}
		users[user] = []byte(hash)
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("--htpasswd %s: no users", path)
	}
	return users, scanner.Err()
}

type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }

// authenticate answers every request without valid basic-auth credentials with 401 and a Basic
// challenge (the distribution spec's UNAUTHORIZED error), and logs each request with its user.
func authenticate(users map[string][]byte, next http.Handler, logger *log.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		user, password, ok := req.BasicAuth()
		hash, known := users[user]
		if ok && known && bcrypt.CompareHashAndPassword(hash, []byte(password)) == nil {
			next.ServeHTTP(rec, req)
		} else {
			if !ok {
				user = "-"
			}
			rec.Header().Set("WWW-Authenticate", fmt.Sprintf("Basic realm=%q", realm))
			rec.Header().Set("Content-Type", "application/json")
			rec.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(rec, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}`)
		}
		logger.Printf("%s %s user=%s status=%d", req.Method, req.URL.Path, user, rec.status)
	})
}
