-- Argo CD health of a NeuronInferenceService (Lua 5.1).
-- Progressing until the operator has acted on the current spec, while compiling and rolling out;
-- Healthy when Ready; Degraded when only a spec change can help (invalid spec, failed compile, a canary the
-- analysis aborted), and while a Neuron fault holds replicas out of service and the fleet is short of them
-- (the Degraded condition). A canary in progress is Progressing.
local hs = {}

local function condition(status, type_)
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == type_ then
        return c
      end
    end
  end
  return nil
end

local degraded = {
  InvalidBuckets = true,
  InvalidSpec = true,
  CompileFailed = true,
  BlockedByFailedCompile = true,
  CanaryAborted = true,
}

if obj.status == nil then
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

local fault = condition(obj.status, "Degraded")
if fault ~= nil and fault.status == "True" then
  hs.status = "Degraded"
  hs.message = fault.reason .. ": " .. (fault.message or "")
  return hs
end

local ready = condition(obj.status, "Ready")
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Phase " .. (obj.status.phase or "Pending")
  return hs
end

local message = ready.reason
if ready.message ~= nil and ready.message ~= "" then
  message = ready.reason .. ": " .. ready.message
end
hs.message = message
if ready.status == "True" then
  hs.status = "Healthy"
elseif degraded[ready.reason] then
  hs.status = "Degraded"
else
  -- Compiling, RollingOut, CanaryProgressing, InsufficientNeuronCapacity (a node autoscaler may still add
  -- capacity).
  hs.status = "Progressing"
end
return hs
