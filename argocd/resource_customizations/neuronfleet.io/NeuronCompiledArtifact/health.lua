-- Argo CD health of a NeuronCompiledArtifact (Lua 5.1): its compile Job's outcome.
local hs = {}

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on generation " .. generation
  return hs
end

local phase = obj.status.phase
local detail = obj.status.message or obj.status.reason or ""
if phase == "Ready" then
  hs.status = "Healthy"
  hs.message = "Compiled" .. (obj.status.location and (" at " .. obj.status.location) or "")
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = (obj.status.reason or "Failed") .. ": " .. (obj.status.message or "the compile failed")
else
  hs.status = "Progressing"
  hs.message = phase .. (detail ~= "" and (": " .. detail) or "")
end
return hs
