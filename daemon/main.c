/* main.c: the familyd process shell: arguments, daemon, loop, exit code. */
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "daemon.h"
#include "log.h"

int main(int argc, char *argv[]) {
        _cleanup_(config_done) Config config = {};
        _cleanup_(daemon_freep) Daemon *daemon = NULL;
        int r;

        r = config_parse(&config, argc, argv);
        if (r < 0)
                return r == -EINVAL ? 2 : EXIT_FAILURE;
        if (r == CONFIG_EXIT)
                return EXIT_SUCCESS;
        log_set_max_level(config.log_level);

        r = daemon_new(&config, &daemon);
        if (r < 0)
                return EXIT_FAILURE;

        r = daemon_run(daemon);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
