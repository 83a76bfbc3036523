package tour;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The guide's tour (tests/conformance/tour.py) as steps run in order, one JSON line each on
 * stdout: {"step", "ok", "error"?, ...what it saw}. A failed step does not stop the others. The
 * part of JavaTour and KotlinTour that is not the SDK: the test's settings and the output.
 */
public final class Steps {
    public static final String API_HOST = System.getenv("SANDGATE_TEST_API_HOST");
    public static final String DENIED_HOST = System.getenv("SANDGATE_TEST_DENIED_HOST");
    public static final String SECRET = System.getenv("SANDGATE_TEST_SECRET");
    public static final String TAG = System.getenv("SANDGATE_TEST_TAG");
    public static final String DOMAIN = System.getenv("OPEN_SANDBOX_DOMAIN");
    public static final String API_KEY = System.getenv("OPEN_SANDBOX_API_KEY");
    private static final Pattern AUTHORIZATION = Pattern.compile("\"authorization\":\\s*\"([^\"]*)\"");

    /** One step: what it saw (may be empty); throws when the step fails. */
    @FunctionalInterface
    public interface Step {
        Map<String, Object> run() throws Exception;
    }

    private final Map<String, Step> steps = new LinkedHashMap<>();

    public Steps add(String name, Step step) {
        steps.put(name, step);
        return this;
    }

    public void runAll() {
        steps.forEach((name, step) -> {
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("step", name);
            line.put("ok", true);
            try {
                line.putAll(step.run());
            } catch (Exception | AssertionError failure) {
                StringWriter trace = new StringWriter();
                failure.printStackTrace(new PrintWriter(trace));
                line.put("ok", false);
                line.put("error", trace.toString());
            }
            System.out.println(json(line));
            System.out.flush();
        });
    }

    public static void expect(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    /** The curl command that fetches URL/echo?tour=TAG-what and prints the body, then the status. */
    public static String curl(String url, String what) {
        return String.format("curl -sS --max-time 15 -w '\\n%%{http_code}' '%s/echo?tour=%s-%s' || true", url, TAG, what);
    }

    /** The Authorization header the test origin's /echo reflected, from its JSON body. */
    public static String echoedAuthorization(String body) {
        Matcher found = AUTHORIZATION.matcher(body);
        expect(found.find(), "no authorization echoed: " + body);
        return found.group(1);
    }

    static String json(Map<String, Object> line) {
        StringBuilder out = new StringBuilder("{");
        line.forEach((key, value) -> {
            if (out.length() > 1) {
                out.append(", ");
            }
            out.append(quoted(key)).append(": ");
            out.append(value instanceof Boolean || value instanceof Number ? value.toString() : quoted(String.valueOf(value)));
        });
        return out.append("}").toString();
    }

    private static String quoted(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                default -> out.append(c < 0x20 ? String.format("\\u%04x", (int) c) : String.valueOf(c));
            }
        }
        return out.append('"').toString();
    }
}
