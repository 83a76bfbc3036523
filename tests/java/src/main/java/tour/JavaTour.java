package tour;

import static tour.Steps.API_HOST;
import static tour.Steps.DENIED_HOST;
import static tour.Steps.SECRET;
import static tour.Steps.expect;

import com.alibaba.opensandbox.sandbox.Sandbox;
import com.alibaba.opensandbox.sandbox.config.ConnectionConfig;
import com.alibaba.opensandbox.sandbox.domain.exceptions.SandboxApiException;
import com.alibaba.opensandbox.sandbox.domain.models.execd.executions.Execution;
import com.alibaba.opensandbox.sandbox.domain.models.execd.executions.OutputMessage;
import com.alibaba.opensandbox.sandbox.domain.models.execd.filesystem.EntryInfo;
import com.alibaba.opensandbox.sandbox.domain.models.execd.filesystem.WriteEntry;
import com.alibaba.opensandbox.sandbox.domain.models.sandboxes.SandboxInfo;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

/**
 * The guide's tour through OpenSandbox's Java SDK (com.alibaba.opensandbox:sandbox 1.0.0), from
 * Java, on one sandbox; `JavaTour direct`. This version has no egress, credential-vault or
 * server-proxy API: the sandbox gets the operator's default policy, whose binding injects the
 * credential (tests/conformance/test_java_sdk.py starts the server so).
 */
public final class JavaTour {
    private static final String FILE = "/tmp/java-tour/notes.txt";
    private static final String TEXT = "written by the Java SDK\n";

    private Sandbox sandbox;

    public static void main(String[] args) {
        new JavaTour().steps().runAll();
        System.exit(0); // the SDK's HTTP client keeps non-daemon threads
    }

    private Steps steps() {
        return new Steps()
                .add("create", this::create)
                .add("command", this::command)
                .add("file", this::file)
                .add("requests", this::requests)
                .add("credential", this::credential)
                .add("renew", this::renew)
                .add("delete", this::delete);
    }

    /** The lines of an output stream (execd sends each line without its terminator). */
    private static String joined(List<OutputMessage> messages) {
        return messages.stream().map(OutputMessage::getText).collect(Collectors.joining("\n"));
    }

    /** A command's stdout; fails when it reports an error (a non-zero exit among them). */
    private String shell(String command) {
        Execution execution = sandbox.commands().run(command);
        expect(execution.getError() == null, command + ": " + execution.getError());
        return joined(execution.getLogs().getStdout());
    }

    /** [status, body] of a request from inside the sandbox. */
    private String[] fetch(String url, String what) {
        String out = shell(Steps.curl(url, what));
        int cut = out.lastIndexOf('\n');
        return new String[] {out.substring(cut + 1).trim(), cut < 0 ? "" : out.substring(0, cut)};
    }

    private Map<String, Object> create() {
        ConnectionConfig connection = ConnectionConfig.builder()
                .domain(Steps.DOMAIN)
                .apiKey(Steps.API_KEY)
                .protocol("http")
                .requestTimeout(Duration.ofSeconds(30))
                // 1.0.0 sends no endpoint headers (execd's token): its execd calls carry the
                // API key instead, which sandgate's reverse proxy (the 44772 endpoint) takes
                .addHeader("OPEN-SANDBOX-API-KEY", Steps.API_KEY)
                .build();
        sandbox = Sandbox.builder()
                .image("sandgate/host")
                .entrypoint("sleep", "infinity")
                .resource(Map.of("cpu", "1", "memory", "512Mi"))
                .env("GREETING", "hello from create")
                .metadata("suite", "java-sdk")
                .readyTimeout(Duration.ofSeconds(30))
                .connectionConfig(connection)
                .build();
        SandboxInfo info = sandbox.getInfo();
        expect(info.getStatus().getState().equals("Running"), "state: " + info.getStatus());
        expect("java-sdk".equals(info.getMetadata().get("suite")), "metadata: " + info.getMetadata());
        String greeting = shell("printf %s \"$GREETING\"");
        expect(greeting.equals("hello from create"), "env: " + greeting);
        return Map.of("sandbox", sandbox.getId().toString());
    }

    private Map<String, Object> command() {
        Execution execution = sandbox.commands().run("echo hello-from-$((40+2)); echo to-stderr >&2");
        expect(execution.getError() == null, "error: " + execution.getError());
        expect(joined(execution.getLogs().getStdout()).trim().equals("hello-from-42"), "stdout: " + execution.getLogs());
        expect(joined(execution.getLogs().getStderr()).trim().equals("to-stderr"), "stderr: " + execution.getLogs());
        Execution failed = sandbox.commands().run("exit 3");
        expect(failed.getError() != null && failed.getError().getValue().equals("3"), "exit 3: " + failed.getError());
        return Map.of();
    }

    private Map<String, Object> file() {
        sandbox.files().writeFile(WriteEntry.builder().path(FILE).data(TEXT).mode(640).build());
        expect(sandbox.files().readFile(FILE).equals(TEXT), "read back");
        EntryInfo info = sandbox.files().readFileInfo(List.of(FILE)).get(FILE);
        expect(info.getMode() == 640 && info.getSize() == TEXT.length(), "info: " + info);
        String stat = shell("stat -c %a " + FILE).trim();
        expect(stat.equals("640"), "stat: " + stat);
        return Map.of();
    }

    private Map<String, Object> requests() {
        String allowed = fetch("http://" + API_HOST, "allowed")[0];
        String denied = fetch("http://" + DENIED_HOST, "denied")[0];
        expect(allowed.equals("200") && !denied.equals("200"), "allowed " + allowed + ", denied " + denied);
        return Map.of("allowed", allowed, "denied", denied);
    }

    private Map<String, Object> credential() {
        String[] answer = fetch("https://" + API_HOST, "credential");
        expect(answer[0].equals("200"), "status " + answer[0] + ": " + answer[1]);
        expect(!answer[1].contains(SECRET), "the sandbox saw the secret: " + answer[1]);
        String authorization = Steps.echoedAuthorization(answer[1]);
        expect(authorization.startsWith("Bearer "), "echoed: " + authorization);
        return Map.of("authorization", authorization);
    }

    private Map<String, Object> renew() {
        OffsetDateTime before = sandbox.getInfo().getExpiresAt();
        sandbox.renew(Duration.ofHours(2));
        OffsetDateTime after = sandbox.getInfo().getExpiresAt();
        expect(after.isAfter(before.plusMinutes(30)), "expiry " + before + " -> " + after);
        return Map.of("expiresAt", after.toString());
    }

    private Map<String, Object> delete() {
        sandbox.kill();
        try {
            sandbox.getInfo();
            throw new AssertionError("the sandbox is still there after kill");
        } catch (SandboxApiException gone) {
            expect(Integer.valueOf(404).equals(gone.getStatusCode()), "after kill: " + gone);
        }
        return Map.of("sandbox", sandbox.getId().toString());
    }
}
