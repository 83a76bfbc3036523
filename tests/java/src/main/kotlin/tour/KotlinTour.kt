// The guide's tour through OpenSandbox's Kotlin SDK (com.alibaba.opensandbox:sandbox 1.0.0, the
// artifact the Java tour uses: the SDK is written in Kotlin), from Kotlin, on one sandbox;
// `KotlinTour direct`. As in JavaTour, this version has no egress, credential-vault or
// server-proxy API: the operator's default policy allows the host and injects the credential.
package tour

import com.alibaba.opensandbox.sandbox.Sandbox
import com.alibaba.opensandbox.sandbox.config.ConnectionConfig
import com.alibaba.opensandbox.sandbox.domain.exceptions.SandboxApiException
import com.alibaba.opensandbox.sandbox.domain.models.execd.executions.OutputMessage
import com.alibaba.opensandbox.sandbox.domain.models.execd.filesystem.WriteEntry
import java.time.Duration
import kotlin.time.Duration.Companion.seconds
import kotlin.time.toJavaDuration
import kotlin.system.exitProcess

private const val FILE = "/tmp/kotlin-tour/notes.txt"
private const val TEXT = "written by the Kotlin SDK\n"

class KotlinTour {
    private lateinit var sandbox: Sandbox

    // the lines of an output stream (execd sends each line without its terminator)
    private fun List<OutputMessage>.joined() = joinToString("\n") { it.text }

    private fun shell(command: String): String {
        val execution = sandbox.commands().run(command)
        Steps.expect(execution.error == null, "$command: ${execution.error}")
        return execution.logs.stdout.joined()
    }

    private fun fetch(url: String, what: String): Pair<String, String> {
        val out = shell(Steps.curl(url, what))
        return out.substringAfterLast('\n').trim() to out.substringBeforeLast('\n', "")
    }

    private fun create(): Map<String, Any> {
        // the builders' Kotlin overloads: maps filled by a lambda with the map as receiver
        val connection = with(ConnectionConfig.builder()) {
            domain(Steps.DOMAIN)
            apiKey(Steps.API_KEY)
            protocol("http")
            requestTimeout(30.seconds.toJavaDuration())
            // 1.0.0 sends no endpoint headers (execd's token): its execd calls carry the API
            // key instead, which sandgate's reverse proxy (the 44772 endpoint) takes
            headers { put("OPEN-SANDBOX-API-KEY", Steps.API_KEY) }
            build()
        }
        sandbox = Sandbox.builder()
            .image("sandgate/host")
            .entrypoint("sleep", "infinity")
            .resource { put("cpu", "1"); put("memory", "512Mi") }
            .env { put("GREETING", "hello from create") }
            .metadata { put("suite", "kotlin-sdk") }
            .readyTimeout(Duration.ofSeconds(30))
            .connectionConfig(connection)
            .build()
        val info = sandbox.getInfo()
        Steps.expect(info.status.state == "Running", "state: ${info.status}")
        Steps.expect(info.metadata?.get("suite") == "kotlin-sdk", "metadata: ${info.metadata}")
        val greeting = shell("printf %s \"\$GREETING\"")
        Steps.expect(greeting == "hello from create", "env: $greeting")
        return mapOf("sandbox" to sandbox.id.toString())
    }

    private fun command(): Map<String, Any> {
        val execution = sandbox.commands().run("echo hello-from-$((40+2)); echo to-stderr >&2")
        Steps.expect(execution.error == null, "error: ${execution.error}")
        Steps.expect(execution.logs.stdout.joined().trim() == "hello-from-42", "stdout: ${execution.logs}")
        Steps.expect(execution.logs.stderr.joined().trim() == "to-stderr", "stderr: ${execution.logs}")
        val failed = sandbox.commands().run("exit 3")
        Steps.expect(failed.error?.value == "3", "exit 3: ${failed.error}")
        return emptyMap()
    }

    private fun file(): Map<String, Any> {
        sandbox.files().writeFile(WriteEntry.builder().path(FILE).data(TEXT).mode(640).build())
        Steps.expect(sandbox.files().readFile(FILE) == TEXT, "read back")
        val info = sandbox.files().readFileInfo(listOf(FILE)).getValue(FILE)
        Steps.expect(info.mode == 640 && info.size == TEXT.length.toLong(), "info: $info")
        val stat = shell("stat -c %a $FILE").trim()
        Steps.expect(stat == "640", "stat: $stat")
        return emptyMap()
    }

    private fun requests(): Map<String, Any> {
        val (allowed, _) = fetch("http://${Steps.API_HOST}", "allowed")
        val (denied, _) = fetch("http://${Steps.DENIED_HOST}", "denied")
        Steps.expect(allowed == "200" && denied != "200", "allowed $allowed, denied $denied")
        return mapOf("allowed" to allowed, "denied" to denied)
    }

    private fun credential(): Map<String, Any> {
        val (status, body) = fetch("https://${Steps.API_HOST}", "credential")
        Steps.expect(status == "200", "status $status: $body")
        Steps.expect(Steps.SECRET !in body, "the sandbox saw the secret: $body")
        val authorization = Steps.echoedAuthorization(body)
        Steps.expect(authorization.startsWith("Bearer "), "echoed: $authorization")
        return mapOf("authorization" to authorization)
    }

    private fun renew(): Map<String, Any> {
        val before = sandbox.getInfo().expiresAt
        sandbox.renew(Duration.ofHours(2))
        val after = sandbox.getInfo().expiresAt
        Steps.expect(after.isAfter(before.plusMinutes(30)), "expiry $before -> $after")
        return mapOf("expiresAt" to after.toString())
    }

    private fun delete(): Map<String, Any> {
        sandbox.kill()
        val gone = runCatching { sandbox.getInfo() }.exceptionOrNull()
        Steps.expect(gone is SandboxApiException && gone.statusCode == 404, "after kill: $gone")
        return mapOf("sandbox" to sandbox.id.toString())
    }

    fun steps(): Steps = Steps()
        .add("create", ::create)
        .add("command", ::command)
        .add("file", ::file)
        .add("requests", ::requests)
        .add("credential", ::credential)
        .add("renew", ::renew)
        .add("delete", ::delete)
}

fun main() {
    KotlinTour().steps().runAll()
    exitProcess(0) // the SDK's HTTP client keeps non-daemon threads
}
