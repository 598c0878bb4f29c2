/* Test models for the C tests: tools/gepard-make-test-model of the build tree. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Writes a model (or codec) with random weights to `out` by running
 * `$GEPARD_BUILD_DIR/tools/gepard-make-test-model OPTIONS OUT`; `options` is its options as a
 * command line fragment ("--preset tiny --seed 7"). Stops the test program with the tool's error
 * where it fails: every test after it needs the model. */
void gepard_test_make_model (const char *options, const char *out);

G_END_DECLS
