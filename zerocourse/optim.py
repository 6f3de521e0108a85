"""Non-sharded mixed-precision Adam: the baseline every ZeRO stage is compared with.

The model trains in half precision (bf16 by default), but the update happens in fp32: for every
trainable parameter the optimizer keeps an fp32 master copy plus Adam's fp32 exp_avg and
exp_avg_sq, i.e. 4 + 4 + 4 = 12 bytes per parameter on top of the 2 + 2 of the bf16 parameter and
its gradient. That is the 16 bytes per parameter of the ZeRO paper, and the state ZeRO shards.

The update is torch.optim.Adam's (foreach=False) applied to the master, op for op, so with fp32
parameters this class and torch.optim.Adam agree bit for bit. Weight decay is L2 added to the
gradient (Adam, not AdamW).

    optimizer = MixedPrecisionAdam(model.parameters(), lr=1e-3)
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""
import torch


class MixedPrecisionAdam:
    """Adam with fp32 master weights for half-precision parameters.

    State, readable by anyone (index i refers to self.params[i]):
        params      the trainable parameters (requires_grad=True), deduplicated by identity
        master      fp32 copies of the parameters: the weights the update really changes
        exp_avg     fp32 first moment (momentum)
        exp_avg_sq  fp32 second moment (variance)
        step_count  number of step() calls (one counter for the whole optimizer)

    Args:
        params: iterable of the model's parameters (bf16, fp16 or fp32). Frozen ones
            (requires_grad=False) are accepted and ignored: they are never updated.
        lr: learning rate.
        betas: coefficients of the running averages of the gradient and its square.
        eps: added to the denominator for numerical stability.
        weight_decay: L2 penalty added to the gradient, as in torch.optim.Adam.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps} (must be >= 0)")
        if len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas} (need two values)")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta} (must be in [0, 1))")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors, such as model.parameters(), "
                            "not a single tensor")
        params = list(params)
        if len(params) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if any(not isinstance(p, torch.Tensor) for p in params):
            raise TypeError("params must be tensors (parameter groups as dicts are not supported)")

        self.lr = lr
        self.betas = tuple(betas)
        self.eps = eps
        self.weight_decay = weight_decay
        self.step_count = 0

        # A tied weight appears once in model.parameters(), but a hand-made list may repeat it:
        # deduplicate by identity so a shared tensor is updated once per step.
        seen = set()
        self.params = []
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)

        # .clone(): for fp32 parameters .float() returns the parameter itself, not a copy.
        self.master = [p.detach().float().clone() for p in self.params]
        self.exp_avg = [torch.zeros_like(m) for m in self.master]
        self.exp_avg_sq = [torch.zeros_like(m) for m in self.master]

    @torch.no_grad()
    def step(self):
        """Update every trainable parameter that has a gradient; others are not touched."""
        self.step_count += 1
        beta1, beta2 = self.betas
        # Bias correction, exactly as torch.optim.Adam computes it (step as a float).
        step = float(self.step_count)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = self.lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5

        for p, master, exp_avg, exp_avg_sq in zip(self.params, self.master, self.exp_avg, self.exp_avg_sq):
            if p.grad is None:
                continue
            grad = p.grad.float()  # the update runs in fp32 (no copy if the grad is already fp32)
            if self.weight_decay != 0:
                grad = grad.add(master, alpha=self.weight_decay)  # out of place: never edit p.grad
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            master.addcdiv_(exp_avg, denom, value=-step_size)
            # The model only ever sees the master rounded to its own dtype.
            p.copy_(master)

    def zero_grad(self, set_to_none=True):
        """Forget the gradients: set them to None (default) or fill them with zeros."""
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def __repr__(self):
        n = sum(p.numel() for p in self.params)
        return (f"MixedPrecisionAdam({len(self.params)} tensors, {n} trainable parameters, lr={self.lr}, "
                f"betas={self.betas}, eps={self.eps}, weight_decay={self.weight_decay})")
