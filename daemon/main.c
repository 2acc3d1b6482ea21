/* main.c: the familyd process shell: arguments, daemon, loop, exit code. */
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "daemon.h"
#include "common/log.h"
#include "sd/notify.h"

int main(int argc, char *argv[]) {
        _cleanup_(config_done) Config config = {};
        _cleanup_(daemon_freep) Daemon *daemon = NULL;
        int r;

        r = config_parse(&config, argc, argv);
        if (r < 0) {
                /* A check (an ExecReload= guard, say) is not the service starting. */
                if (!config.check_config && !config.check_registry)
                        notifier_start_failed(r);
                return r == -EINVAL ? 2 : EXIT_FAILURE;
        }
        if (r == CONFIG_EXIT)
                return EXIT_SUCCESS;
        log_set_max_level(config.log_level);

        /* Before anything is bound: a bad path leaves no socket behind. */
        r = config_check_paths(&config);
        if (r < 0) {
                notifier_start_failed(r);
                return EXIT_FAILURE;
        }

        /* Loads the registry, binds or adopts the sockets, starts the servers. */
        r = daemon_new(&config, &daemon);
        if (r < 0) {
                notifier_start_failed(r);
                return EXIT_FAILURE;
        }

        /* READY=1 as the loop starts; STOPPING=1 when a signal ends it. */
        r = daemon_run(daemon);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
