"""metaledger's own MCP endpoint (`/mcp`): DataHub's MCP tools and metaledger's, over the Model Context Protocol's
streamable HTTP transport (app.mcp.server), declared once in app.mcp.tools."""
