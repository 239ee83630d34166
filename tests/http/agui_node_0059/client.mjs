// @ag-ui/client 0.0.59 (CopilotKit's pin), for ../agui_node/drive.mjs run in this folder.
// This version validates every event with its zod EventSchemas (re-exported from core).
export * from "@ag-ui/client";
