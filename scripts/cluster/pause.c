/* The Pod sandbox's pause process for the cluster of `make cluster`: holds the Pod's namespaces,
 * reaps orphans (it is PID 1 of the Pod when the PID namespace is shared), exits on INT/TERM.
 * Built static by build.sh and packed into an image that containerd imports (no registry). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) { _exit(128 + signo); }

static void reap(int signo) {
	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction on_stop = {.sa_handler = stop};
	struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
	    sigaction(SIGCHLD, &on_child, NULL) < 0)
		return 1;
	for (;;)
		pause();
}
