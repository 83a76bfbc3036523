// The guide's tour (tests/conformance/tour.py) through OpenSandbox's Go SDK, unchanged, on one
// sandbox: `tour direct|server_proxy` prints one JSON line per step, {"step", "ok", "error"?,
// ...what it saw}. A failed step does not stop the others; the sandbox is killed at the end
// whatever happened. Built and run by tests/conformance/test_go_sdk.py.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	opensandbox "github.com/alibaba/OpenSandbox/sdks/sandbox/go"
)

const (
	stepTimeout = 60 * time.Second
	filePath    = "/tmp/go-tour/notes.txt"
	fileText    = "written by the Go SDK\n"
)

var (
	apiHost    = os.Getenv("SANDGATE_TEST_API_HOST")
	deniedHost = os.Getenv("SANDGATE_TEST_DENIED_HOST")
	secret     = os.Getenv("SANDGATE_TEST_SECRET")
	tag        = os.Getenv("SANDGATE_TEST_TAG")
)

type seen map[string]any

type tour struct {
	config  opensandbox.ConnectionConfig
	sandbox *opensandbox.Sandbox
	killed  bool
}

func expect(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// shell runs a command and returns its stdout, failing on a non-zero exit.
func (t *tour) shell(ctx context.Context, command string) (string, error) {
	execution, err := t.sandbox.RunCommand(ctx, command, nil)
	if err != nil {
		return "", err
	}
	if execution.ExitCode == nil || *execution.ExitCode != 0 {
		return "", fmt.Errorf("%q: exit %v, error %+v", command, execution.ExitCode, execution.Error)
	}
	return execution.Text(), nil
}

// curl fetches URL/echo?tour=TAG-what from inside: the HTTP status and the body. Plain HTTP
// for hosts the proxy passes through (the sandbox does not trust the test origin's CA); HTTPS
// where a vault binding makes the proxy intercept (the sandbox trusts the proxy's CA).
func (t *tour) curl(ctx context.Context, url, what string) (string, string, error) {
	out, err := t.shell(ctx, fmt.Sprintf(
		"curl -sS --max-time 15 -w '\\n%%{http_code}' '%s/echo?tour=%s-%s' || true", url, tag, what))
	cut := strings.LastIndex(out, "\n")
	if err != nil || cut < 0 {
		return "", out, err
	}
	return strings.TrimSpace(out[cut+1:]), out[:cut], nil
}

func (t *tour) create(ctx context.Context) (seen, error) {
	sandbox, err := opensandbox.CreateSandbox(ctx, t.config, opensandbox.SandboxCreateOptions{
		Image:          "sandgate/host",
		Entrypoint:     []string{"sleep", "infinity"},
		ResourceLimits: opensandbox.ResourceLimits{"cpu": "1", "memory": "512Mi"},
		Env:            map[string]string{"GREETING": "hello from create"},
		Metadata:       map[string]string{"suite": "go-sdk"},
		NetworkPolicy: &opensandbox.NetworkPolicy{
			DefaultAction: "deny",
			Egress:        []opensandbox.NetworkRule{{Action: "allow", Target: apiHost}},
		},
		CredentialProxy: &opensandbox.CredentialProxyConfig{Enabled: true},
		ReadyTimeout:    30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	t.sandbox = sandbox
	info, err := sandbox.GetInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := expect(info.Status.State == opensandbox.StateRunning && info.Metadata["suite"] == "go-sdk",
		"info: %+v", info); err != nil {
		return nil, err
	}
	greeting, err := t.shell(ctx, `printf %s "$GREETING"`)
	if err != nil {
		return nil, err
	}
	return seen{"sandbox": sandbox.ID()}, expect(greeting == "hello from create", "env: %q", greeting)
}

func (t *tour) command(ctx context.Context) (seen, error) {
	execution, err := t.sandbox.RunCommand(ctx, "echo hello-from-$((40+2)); echo to-stderr >&2", nil)
	if err != nil {
		return nil, err
	}
	if err := expect(execution.ExitCode != nil && *execution.ExitCode == 0, "exit: %v", execution.ExitCode); err != nil {
		return nil, err
	}
	if err := expect(strings.TrimSpace(execution.Text()) == "hello-from-42", "stdout: %q", execution.Text()); err != nil {
		return nil, err
	}
	failed, err := t.sandbox.RunCommand(ctx, "exit 3", nil)
	if err != nil {
		return nil, err
	}
	return nil, expect(failed.ExitCode != nil && *failed.ExitCode == 3, "exit 3 reported as %v", failed.ExitCode)
}

func (t *tour) file(ctx context.Context) (seen, error) {
	err := t.sandbox.UploadFile(ctx, strings.NewReader(fileText), opensandbox.UploadFileOptions{
		FileName: "notes.txt",
		Metadata: opensandbox.FileMetadata{Path: filePath, Mode: 640},
	})
	if err != nil {
		return nil, err
	}
	body, err := t.sandbox.DownloadFile(ctx, filePath, "")
	if err != nil {
		return nil, err
	}
	defer body.Close()
	read, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	if err := expect(string(read) == fileText, "read back: %q", read); err != nil {
		return nil, err
	}
	infos, err := t.sandbox.GetFileInfo(ctx, filePath)
	if err != nil {
		return nil, err
	}
	if err := expect(infos[filePath].Mode == 640 && infos[filePath].Size == int64(len(fileText)),
		"info: %+v", infos); err != nil {
		return nil, err
	}
	stat, err := t.shell(ctx, "stat -c %a "+filePath)
	if err != nil {
		return nil, err
	}
	return nil, expect(strings.TrimSpace(stat) == "640", "stat: %q", stat)
}

func rulesOf(status *opensandbox.PolicyStatusResponse) []string {
	var rules []string
	if status.Policy != nil {
		for _, rule := range status.Policy.Egress {
			rules = append(rules, rule.Action+":"+rule.Target)
		}
	}
	return rules
}

func (t *tour) egress(ctx context.Context) (seen, error) {
	status, err := t.sandbox.GetEgressPolicy(ctx)
	if err != nil {
		return nil, err
	}
	if err := expect(fmt.Sprint(rulesOf(status)) == fmt.Sprint([]string{"allow:" + apiHost}),
		"policy: %v", rulesOf(status)); err != nil {
		return nil, err
	}
	blocked := "blocked." + apiHost
	if _, err := t.sandbox.PatchEgressRules(ctx, []opensandbox.NetworkRule{{Action: "deny", Target: blocked}}); err != nil {
		return nil, err
	}
	status, err = t.sandbox.GetEgressPolicy(ctx)
	if err != nil {
		return nil, err
	}
	want := []string{"deny:" + blocked, "allow:" + apiHost}
	return seen{"rules": rulesOf(status)}, expect(fmt.Sprint(rulesOf(status)) == fmt.Sprint(want), "patched: %v", rulesOf(status))
}

func (t *tour) requests(ctx context.Context) (seen, error) {
	allowed, _, err := t.curl(ctx, "http://"+apiHost, "allowed")
	if err != nil {
		return nil, err
	}
	denied, _, err := t.curl(ctx, "http://"+deniedHost, "denied")
	if err != nil {
		return nil, err
	}
	found := seen{"allowed": allowed, "denied": denied}
	return found, expect(allowed == "200" && denied != "200", "statuses: %v", found)
}

func (t *tour) credential(ctx context.Context) (seen, error) {
	state, err := t.sandbox.CreateCredentialVault(ctx, opensandbox.CredentialVaultCreateRequest{
		Credentials: []opensandbox.Credential{{
			Name:   "api-token",
			Source: opensandbox.InlineCredentialSource{Type: opensandbox.CredentialSourceInline, Value: secret},
		}},
		Bindings: []opensandbox.CredentialBinding{{
			Name:  "api",
			Match: opensandbox.CredentialMatch{Hosts: []string{apiHost}},
			Auth:  opensandbox.CredentialAuth{Type: opensandbox.CredentialAuthBearer, Credential: "api-token"},
		}},
	})
	if err != nil {
		return nil, err
	}
	if err := expect(state.Revision == 1 && len(state.Credentials) == 1, "vault: %+v", state); err != nil {
		return nil, err
	}
	shown, err := t.sandbox.GetCredentialVault(ctx)
	if err != nil {
		return nil, err
	}
	if raw, _ := json.Marshal(shown); strings.Contains(string(raw), secret) {
		return nil, errors.New("the vault state shows the secret")
	}
	status, body, err := t.curl(ctx, "https://"+apiHost, "credential")
	if err != nil {
		return nil, err
	}
	var echoed struct {
		Headers map[string]string `json:"headers"`
	}
	if err := json.Unmarshal([]byte(body), &echoed); err != nil {
		return nil, fmt.Errorf("%s: %q: %w", status, body, err)
	}
	authorization := echoed.Headers["authorization"]
	if err := expect(!strings.Contains(body, secret), "the sandbox saw the secret: %q", body); err != nil {
		return nil, err
	}
	return seen{"authorization": authorization}, expect(strings.HasPrefix(authorization, "Bearer "), "echoed: %q", body)
}

func (t *tour) renew(ctx context.Context) (seen, error) {
	before, err := t.sandbox.GetInfo(ctx)
	if err != nil {
		return nil, err
	}
	renewed, err := t.sandbox.Renew(ctx, 2*time.Hour)
	if err != nil {
		return nil, err
	}
	after, err := t.sandbox.GetInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := expect(before.ExpiresAt != nil && after.ExpiresAt != nil && after.ExpiresAt.After(*before.ExpiresAt),
		"expiry %v -> %v", before.ExpiresAt, after.ExpiresAt); err != nil {
		return nil, err
	}
	return seen{"expiresAt": renewed.ExpiresAt}, expect(after.ExpiresAt.Sub(renewed.ExpiresAt).Abs() < time.Second,
		"renew answered %v, info says %v", renewed.ExpiresAt, after.ExpiresAt)
}

func (t *tour) code(ctx context.Context) (seen, error) {
	kernel, err := t.sandbox.CreateContext(ctx, opensandbox.CreateContextRequest{Language: "python"})
	if err != nil {
		return nil, err
	}
	if _, err := t.sandbox.ExecuteCode(ctx, opensandbox.RunCodeRequest{Context: kernel, Code: "x = 6 * 7"}, nil); err != nil {
		return nil, err
	}
	execution, err := t.sandbox.ExecuteCode(ctx, opensandbox.RunCodeRequest{Context: kernel, Code: "print('kept', x)\nx"}, nil)
	if err != nil {
		return nil, err
	}
	if err := expect(execution.Error == nil && len(execution.Results) == 1, "execution: %+v", execution); err != nil {
		return nil, err
	}
	if err := expect(execution.Results[0].Text() == "42" && strings.TrimSpace(execution.Text()) == "kept 42",
		"result %q, stdout %q", execution.Results[0].Text(), execution.Text()); err != nil {
		return nil, err
	}
	return nil, t.sandbox.DeleteContext(ctx, kernel.ID)
}

func (t *tour) delete(ctx context.Context) (seen, error) {
	if err := t.sandbox.Kill(ctx); err != nil {
		return nil, err
	}
	t.killed = true
	_, err := t.sandbox.GetInfo(ctx)
	var apiErr *opensandbox.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		return nil, fmt.Errorf("after kill: %v", err)
	}
	return seen{"sandbox": t.sandbox.ID()}, nil
}

func main() {
	mode := os.Args[len(os.Args)-1]
	t := &tour{config: opensandbox.ConnectionConfig{
		Domain:         os.Getenv("OPEN_SANDBOX_DOMAIN"),
		APIKey:         os.Getenv("OPEN_SANDBOX_API_KEY"),
		Protocol:       "http",
		RequestTimeout: 30 * time.Second,
		UseServerProxy: mode == "server_proxy",
		DisableMetrics: true,
	}}
	steps := []struct {
		name string
		run  func(context.Context) (seen, error)
	}{
		{"create", t.create}, {"command", t.command}, {"file", t.file}, {"egress", t.egress},
		{"requests", t.requests}, {"credential", t.credential}, {"renew", t.renew}, {"code", t.code},
		{"delete", t.delete},
	}
	defer func() {
		if t.sandbox != nil && !t.killed {
			_ = t.sandbox.Kill(context.Background())
		}
	}()
	for _, step := range steps {
		line := seen{"step": step.name, "ok": true}
		if t.sandbox == nil && step.name != "create" {
			line["ok"], line["error"] = false, "no sandbox: create failed"
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
			found, err := step.run(ctx)
			cancel()
			for key, value := range found {
				line[key] = value
			}
			if err != nil {
				line["ok"], line["error"] = false, err.Error()
			}
		}
		out, _ := json.Marshal(line)
		fmt.Println(string(out))
	}
}
