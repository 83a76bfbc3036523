# The code-interpreter example of OpenSandbox's guide, verbatim, against sandgate.
# Connection settings come from the environment, as the OpenSandbox SDK reads them:
#   export OPEN_SANDBOX_DOMAIN=127.0.0.1:8080 OPEN_SANDBOX_API_KEY=$(cat /var/lib/sandgate/api_key)
#   .venv/bin/python examples/code-interpreter/guide.py
# It needs the opensandbox/code-interpreter image (`make images`, then for the local runtime
# `sandgate image import <the archive it names> opensandbox/code-interpreter:v1.1.0`).
import asyncio
from datetime import timedelta
from code_interpreter import CodeInterpreter, SupportedLanguage
from opensandbox import Sandbox
from opensandbox.models import WriteEntry
async def main() -> None:
    # Create a sandbox
    sandbox = await Sandbox.create(
        "opensandbox/code-interpreter:v1.1.0",
        entrypoint=["/opt/code-interpreter/code-interpreter.sh"],
        env={"PYTHON_VERSION": "3.11"},
        timeout=timedelta(minutes=10),
    )
    async with sandbox:
        # Execute a shell command
        execution = await sandbox.commands.run("echo 'Hello OpenSandbox!'")
        print(execution.logs.stdout[0].text)
        # Write a file
        await sandbox.files.write_files([
            WriteEntry(path="/tmp/hello.txt", data="Hello World", mode=644)
        ])
        # Read a file
        content = await sandbox.files.read_file("/tmp/hello.txt")
        print(f"Content: {content}")
        # Create a code interpreter and execute Python code
        interpreter = await CodeInterpreter.create(sandbox)
        result = await interpreter.codes.run(
            """
            import sys
            print(sys.version)
            result = 2 + 2
            result
            """,
            language=SupportedLanguage.PYTHON,
        )
        print(result.result[0].text)
        print(result.logs.stdout[0].text)
        # Cleanup the sandbox
        await sandbox.kill()
if __name__ == "__main__":
    asyncio.run(main())
