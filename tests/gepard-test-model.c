#include "gepard-test-model.h"

void
gepard_test_make_model (const char *options, const char *out)
{
  const char *build = g_getenv ("GEPARD_BUILD_DIR");
  g_autofree char *tool
      = g_build_filename (build != NULL ? build : "build", "tools", "gepard-make-test-model", NULL);
  g_autofree char *quoted_tool = g_shell_quote (tool);
  g_autofree char *quoted_out = g_shell_quote (out);
  g_autofree char *command = g_strdup_printf ("%s %s %s", quoted_tool, options, quoted_out);
  g_autofree char *errors = NULL;
  g_autoptr (GError) error = NULL;
  int status = 0;
  if (!g_spawn_command_line_sync (command, NULL, &errors, &status, &error)
      || !g_spawn_check_wait_status (status, &error))
    g_error ("%s: %s\n%s", command, error->message, errors != NULL ? errors : "");
}
